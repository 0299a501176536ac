"""Checkpoints: everything needed to resume training, saved as one consistent cut.

Save (every worker calls it; it is collective):

1. every worker flushes its pushes and meets the others at a barrier, so no push is
   applied between the start and the end of the save (a consistent cut);
2. worker 0 creates a staging folder beside the target (:mod:`.staging`), asks every
   server to write its shard of every table there (Arrow IPC, see
   :mod:`sparseps.files.shards`), writes each table's pending tombstones, the dense
   parameters and their optimizer state (``dense.npz``), and ``MANIFEST.json`` last,
   atomically, listing every file with size and checksum; then swaps the staging folder
   in at the target, so a crash at any point leaves the previous checkpoint loadable;
3. a second barrier releases the workers.

Load re-routes keys, so a checkpoint saved by S servers loads onto any number of them.
A table loads when its *layout* matches (:func:`layout_of`): rule hyper-parameters such
as the learning rate may change between runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from ..files import manifest as mf
from ..files import shards
from ..table.layout import RowLayout

__all__ = [
    "check_replaceable",
    "check_tables",
    "layout_of",
    "read_tombstones",
    "write_tombstones",
]

# What a checkpoint folder may hold: the manifest, shard/tombstone files, dense.npz and the
# writers' temporary files. A folder with anything else is not replaced by a save.
_CHECKPOINT_FILE = re.compile(r"^(MANIFEST\.json|dense\.npz|.+\.arrow|\..+\.tmp-\d+)$")


def layout_of(config) -> dict:
    """What the stored columns of a table depend on: dim, rule name and state widths.

    The rule name is part of it because two rules may store state of the same width with
    different meanings (Adagrad's accumulator vs FTRL's z); hyper-parameters are not.
    """
    layout = RowLayout.for_config(config).to_dict()  # a split table's both parts
    return {"rule": config.rule.name, **layout}


def _layout_saved(entry: dict) -> dict:
    """The manifest's layout; an older manifest without one gets it from its config."""
    if "layout" in entry:
        return entry["layout"]
    from ..config import TableConfig

    return layout_of(TableConfig.from_dict(entry["config"]))


def _brief(layout: dict) -> str:
    state = ", ".join(f"{n}[{w}]" for n, w in layout.get("state_columns", [])) or "none"
    return f"dim={layout.get('dim')}, rule={layout.get('rule')}, state={state}"


def check_tables(directory: Path, saved: dict, expected: dict) -> None:
    """The model's tables must have the row layout the checkpoint holds.

    Args:
        directory: the checkpoint (for messages).
        saved: manifest ``tables`` section (name -> {"layout": ..., "config": ...}).
        expected: the model's tables (name -> TableConfig).

    Raises:
        CheckpointError: a table is missing, or its layout differs (names the table, the
            expected and the found layout).
    """
    for name, config in expected.items():
        entry = saved.get(name)
        if entry is None:
            raise CheckpointError(
                f"{directory}: table {name!r} of the model is not in the checkpoint "
                f"(it holds {sorted(saved) or 'no tables'})"
            )
        want, found = layout_of(config), _layout_saved(entry)
        if want != found:
            raise CheckpointError(
                f"{directory}: table {name!r} layout does not match: the model expects "
                f"{_brief(want)}, the checkpoint holds {_brief(found)}; load it into a model "
                "whose table has the saved dim and optimizer rule"
            )


def check_replaceable(target: Path) -> None:
    """A save replaces ``target`` only if it is empty or a checkpoint (never user files)."""
    if not target.exists():
        return
    if not target.is_dir():
        raise CheckpointError(
            f"{target}: exists and is not a directory; save the checkpoint elsewhere"
        )
    manifest = target / mf.MANIFEST
    if manifest.is_file():
        try:
            fmt = mf.read_manifest(target).get("format")
        except CheckpointError:
            fmt = None
        if fmt == "sparseps-checkpoint":
            return
    other = sorted(p.name for p in target.iterdir() if not _CHECKPOINT_FILE.fullmatch(p.name))
    if other:
        raise CheckpointError(
            f"{target}: holds files that are not part of a checkpoint ({other[:3]}); a save "
            "replaces the whole folder, so choose an empty folder or an existing checkpoint"
        )


def write_tombstones(folder: Path, table: str, keys: np.ndarray) -> dict:
    """``{table}.tombstones.arrow``: keys deleted by shrink since the last inference save."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    return shards.write_shard(
        folder, f"{table}.tombstones.arrow", {"key": keys}, {"kind": "tombstones", "table": table}
    )


def read_tombstones(path: Path, sha256: str | None = None) -> np.ndarray:
    meta, columns = shards.read_shard(path, sha256=sha256)
    if meta.get("kind") != "tombstones":
        raise CheckpointError(f"{path}: is a {meta.get('kind')!r} file, expected tombstones")
    return columns["key"]
