"""The files floor: the formats the servers write and the checkpoint code reads.

- :mod:`.shards`: a table's rows as Arrow IPC shard files (and pending, tombstones);
- :mod:`.dense`: the dense parameters + optimizer state file (``dense.npz``);
- :mod:`.manifest`: ``MANIFEST.json`` (every file with size and checksum, written last);
- :mod:`.writer_lock`: the lock that marks a folder being written.

Both ``sparseps.server`` (writes on ``save``) and ``sparseps.checkpoint`` (coordinates,
verifies, reads without servers) import these; neither imports the other for them.
"""
