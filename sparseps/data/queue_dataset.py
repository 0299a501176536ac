"""QueueDataset: stream this worker's files as batches, one pass per iteration."""

from __future__ import annotations

from collections.abc import Iterator

from .dataset import DatasetBase, rebatch
from .schema import Batch

__all__ = ["QueueDataset"]


class QueueDataset(DatasetBase):
    """Batches streamed from files by reader threads through a bounded queue.

    Example::

        ds = QueueDataset(["data/train"], CRITEO, batch_size=512, threads=2)
        for batch in ds:            # one pass; iterating again starts a new pass
            ...
        print(ds.stats())

    Args:
        files: a file, a folder (= its files, sorted) or a list of them. Every worker
            sorts the whole list and reads ``files[rank::world]`` (see ``split``).
        schema: the columns (e.g. :data:`~sparseps.data.CRITEO`).
        batch_size: samples per batch (the last batch of a pass may be shorter).
        threads: reader threads (each parses whole files; with 1 the sample order is
            the file and line order).
        pipe_command: a shell command run per file (file on stdin); its stdout is parsed.
            A bare ``python``/``python3`` in it is this process's interpreter
            (:func:`sparseps.data.pipe.shell_script`).
        format: ``criteo_tsv``, ``csv`` (with header), ``slot_text``, ``parquet``,
            ``multislot`` or ``multislot_string`` (Paddle's data generators' output, see
            :mod:`sparseps.data.multislot`); default ``criteo_tsv``, or ``slot_text`` when
            ``pipe_command`` is set.
        rank, world: this worker's share; both None = from the environment
            (``SPARSEPS_RANK``/``SPARSEPS_WORKER_NUM``), or 0 of 1 in local mode.
        drop_last: drop the last, short batch of a pass.
        strict: raise :class:`~sparseps.errors.InputError` on the first bad line
            instead of counting and skipping it.
        queue_size: parsed chunks (about 8 MB of text each) buffered between the
            readers and the consumer.
        pipe_timeout: seconds a pipe command may stay silent before it is killed.
        split: ``"static"`` (default): worker ``rank`` reads ``files[rank::world]``;
            ``"steal"``: its reader threads take the next file from a queue shared by the
            job, so a slow worker reads fewer files (see :mod:`sparseps.data.steal`);
            ``"none"``: every worker reads every file (Paddle's reading when the file list
            is not split with ``fleet.util.get_file_shard``; not with ``journal``).
        journal: a folder where each worker records the files it finished (every row
            trained), so that a pass run again after a crash skips them (see
            :mod:`sparseps.data.steal` for the exact guarantee); None: no record.
        store: the ``torch.distributed.Store`` that ``split="steal"`` claims files on
            and ``journal`` agrees on; default the job's rendezvous store.
        steal_key: a name for the dataset's file queue (and journal entries), equal on
            every worker that reads it together; default: the file list's digest and how
            many stealing datasets over it this worker made before (so workers must build
            their datasets in the same order). Give one when workers do not (a worker
            that joined the job later, a load dropped and made again).
        lease_s: with ``split="steal"``, a worker silent this long (no heartbeat on the
            store) is taken for dead and its claimed files not yet handed out are read by
            the others; a worker whose tickets ran out then waits until every file is
            handed out (not with a sync-mode trainer; see :mod:`sparseps.data.steal`).
            None (default): no lease.
        max_bad_ratio: the share of a pass's lines (on this worker) that may be bad and
            skipped, default 0.01; above it, or when every line is bad, the pass raises
            :class:`~sparseps.errors.InputError` (see :mod:`sparseps.data.stats`).

    Raises:
        ConfigError: an argument is invalid (names it).
        InputError: a file or folder does not exist; (when iterating) a pass with too
            many bad lines.
    """

    def __iter__(self) -> Iterator[Batch]:
        return self._tracked(
            rebatch(self._read_chunks(), self.options.batch_size, drop_last=self.options.drop_last)
        )

    def __repr__(self) -> str:
        o = self.options
        return (
            f"QueueDataset({len(self.files)} of {len(o.files)} files, format={o.format.value}, "
            f"batch_size={o.batch_size}, threads={o.threads}, rank={o.rank}/{o.world})"
        )
