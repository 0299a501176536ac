"""Inference models: filtered embeddings + the dense head exported to TorchScript.

An inference model directory is a chain of saves, each a folder with its own manifest::

    DIR/base-00003/   MANIFEST.json, head.pt, {table}.base-RRRRR-of-SSSSS.arrow ...
    DIR/delta-00004/  MANIFEST.json, head.pt, {table}.delta-..., {table}.tombstones.arrow
    DIR/delta-00005/  ...

Sequence numbers increase across bases and deltas. Each save is written into a hidden
staging folder and renamed into place once its manifest is written (see
:mod:`.staging`), so a crash never leaves a ``base-``/``delta-`` folder without a
manifest. A reader takes the newest complete base and applies, in order, every complete
delta after it (stopping at the first missing or incomplete one). Embedding files hold ``key: uint64`` and
``embedding: fixed_size_list<float32>[dim]``; tombstone files hold ``key`` (keys that
shrink deleted: they fall back to what a pull of an unknown key gives in training).
``head.pt`` is ``torch.jit.script`` of the model's ``head(dense, *pooled)``; the
manifest's ``embeddings`` section lists, in head argument order, each embedding
module's table, dim, slots and pooling.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..files import manifest as mf
from . import staging
from .checkpoint import write_tombstones
from .hooks import NO_HOOKS, SaveHooks

__all__ = ["HEAD_FILE", "chain", "saves", "write_inference"]

log = logging.getLogger(__name__)

HEAD_FILE = "head.pt"
_FOLDER = re.compile(r"^(base|delta)-(\d{5})$")


def saves(directory: Path) -> list[tuple[int, str, Path]]:
    """Inference save folders ``(sequence, kind, path)`` in ``directory``, complete or not,
    oldest first."""
    found = []
    if directory.is_dir():
        for child in directory.iterdir():
            match = _FOLDER.fullmatch(child.name)
            if match and child.is_dir():
                found.append((int(match.group(2)), match.group(1), child))
    return sorted(found)


def chain(directory: str | Path) -> list[Path]:
    """The folders to load, in order: newest complete base, then its complete deltas.

    Raises:
        CheckpointError: no complete base save in ``directory``.
    """
    directory = Path(directory)
    found = saves(directory)
    complete = {path for _, _, path in found if (path / mf.MANIFEST).is_file()}
    bases = [i for i, (_, kind, path) in enumerate(found) if kind == "base" and path in complete]
    if not bases:
        raise CheckpointError(
            f"{directory}: no complete base inference model (base-NNNNN with a {mf.MANIFEST})"
        )
    start = bases[-1]
    result = [found[start][2]]
    for _, kind, path in found[start + 1 :]:
        if kind != "delta" or path not in complete:
            log.warning(
                "%s: stopping at %s (incomplete or unexpected); later saves are ignored",
                directory,
                path.name,
            )
            break
        result.append(path)
    return result


def _script_head(model) -> torch.jit.ScriptModule:
    head = getattr(model, "head", None)
    if head is None or not hasattr(model, "embeddings"):
        raise CheckpointError(
            "save_inference_model needs a sparseps.nn.SparseModel (embeddings + head(dense, *pooled)); "
            f"got {type(model).__name__}"
        )
    was_training = head.training
    head.eval()
    try:
        return torch.jit.script(head)
    finally:
        head.train(was_training)


def write_inference(trainer, directory: Path, mode: str, *, hooks: SaveHooks = NO_HOOKS) -> Path:
    """Worker 0's part of ``save_inference_model``: servers write rows, we write the rest.

    Everything goes into a hidden staging folder that is renamed to ``{mode}-NNNNN`` once
    its manifest is written, so a crash leaves no incomplete save in the chain. The
    servers' changed-rows marker is *not* reset here (see ``trainer_files``): a save that
    never lands must leave its rows for the next delta. ``hooks``: fault injection for
    tests (:mod:`.hooks`).
    """
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    found = saves(directory)
    if mode == "delta" and not any(kind == "base" for _, kind, _ in found):
        raise CheckpointError(
            f"{directory}: a delta needs a base inference model first (save mode='base')"
        )
    sequence = (found[-1][0] + 1) if found else 0
    target = directory / f"{mode}-{sequence:05d}"
    for other in ("base", "delta"):  # an interrupted save may have had the other kind
        staging.remove_stale(directory / f"{other}-{sequence:05d}")
    # a failed save leaves its hidden staging folder, out of the chain; the next save removes it
    folder = staging.new_staging(target)
    _write_save(trainer, folder, mode, sequence, hooks)
    staging.commit(folder, target, hooks=hooks)
    log.info("inference model (%s) saved to %s", mode, target)
    return target


def _write_save(trainer, folder: Path, mode: str, sequence: int, hooks: SaveHooks) -> None:
    files: dict[str, dict] = {}
    tables: dict[str, dict] = {}
    for name, config in trainer.tables.items():
        records = trainer.state.client.save_inference(name, str(folder), mode)
        hooks.after_table_saved(name)
        tombstones = trainer.state.tombstones(name) if mode == "delta" else np.empty(0, np.uint64)
        if tombstones.size:
            records = [*records, write_tombstones(folder, name, tombstones)]
        for record in records:
            files[record["name"]] = {"size": record["bytes"], "sha256": record["sha256"]}
        tables[name] = {
            "config": config.to_dict(),
            "rows": sum(r["rows"] for r in records if r["kind"] == mode),
            "tombstones": int(tombstones.size),
            "files": sorted(r["name"] for r in records),
        }
    head = _script_head(trainer.model)
    head.save(str(folder / HEAD_FILE))
    files[HEAD_FILE] = mf.file_record(folder / HEAD_FILE)
    embeddings = [
        {
            "table": e.table,
            "dim": e.dim,
            "slots": list(e.slots) if e.slots is not None else None,
            "pooling": e.pooling,
        }
        for e in trainer.model.embeddings
    ]
    mf.write_manifest(
        folder,
        "sparseps-inference",
        files,
        kind=mode,
        sequence=sequence,
        tables=tables,
        embeddings=embeddings,
        state={"passes": trainer.state.passes},
    )
