"""Checkpoints: everything needed to resume training, saved as one consistent cut.

Save (every worker calls it; it is collective):

1. every worker flushes its pushes and meets the others at a barrier, so no push is
   applied between the start and the end of the save (a consistent cut);
2. worker 0 invalidates an older manifest in the directory, asks every server to write
   its shard of every table (Arrow IPC, see :mod:`sparseps.server.shards`), writes the
   dense parameters and their optimizer state (``dense.npz``), and writes
   ``MANIFEST.json`` last, atomically, listing every file with size and checksum;
3. a second barrier releases the workers.

Load re-routes keys, so a checkpoint saved by S servers loads onto any number of them.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from . import manifest as mf

__all__ = ["check_tables", "invalidate"]


def check_tables(directory: Path, saved: dict, expected: dict) -> None:
    """The model's tables must match what the checkpoint holds (dim and optimizer rule).

    Args:
        saved: manifest ``tables`` section (name -> {"config": ...}).
        expected: the model's tables (name -> TableConfig).

    Raises:
        CheckpointError: naming the table, the expected and the found layout.
    """
    for name, config in expected.items():
        entry = saved.get(name)
        if entry is None:
            raise CheckpointError(
                f"{directory}: table {name!r} of the model is not in the checkpoint "
                f"(it holds {sorted(saved) or 'no tables'})"
            )
        want = config.to_dict()
        found = entry["config"]
        for key in ("dim", "rule"):
            if want.get(key) != found.get(key):
                raise CheckpointError(
                    f"{directory}: table {name!r} layout does not match: expected {key}={want.get(key)!r}, "
                    f"found {key}={found.get(key)!r}"
                )


def invalidate(directory: Path) -> None:
    """Remove an old manifest first, so a crash mid-save never leaves a stale-but-valid look."""
    (Path(directory) / mf.MANIFEST).unlink(missing_ok=True)
