"""Collective save/load of checkpoints and inference models, driven by the trainer.

Every worker calls these (they contain barriers); worker 0 talks to the servers and
writes the manifest. They work through the trainer's public parts: its
:class:`~sparseps.worker.state.TrainingState` (``trainer.state``: client, mode, dense
parameters, tombstones, passes), ``tables``, ``dense_rule``, ``strategy`` and ``model``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..core import collectives
from ..errors import CheckpointError
from ..files import manifest as mf
from . import checkpoint as ck
from . import inference, staging
from .hooks import NO_HOOKS, SaveHooks

__all__ = ["load_checkpoint", "save_checkpoint", "save_inference_model"]

log = logging.getLogger(__name__)


def save_checkpoint(
    trainer, directory: str | Path, *, state: dict | None = None, hooks: SaveHooks = NO_HOOKS
) -> dict | None:
    """Save every table, the dense model and ``state``; returns the manifest (worker 0).

    ``hooks`` (fault injection for tests, :mod:`.hooks`) is called at the save's named
    points on worker 0.
    """
    trainer.state.quiesce()
    return _on_worker_zero(
        trainer, "save_checkpoint", _write_checkpoint, trainer, Path(directory), state or {},
        hooks,
    )  # fmt: skip


def _write_checkpoint(trainer, directory: Path, state: dict, hooks: SaveHooks) -> dict:
    target = directory.resolve()
    staging.recover(target)
    ck.check_replaceable(target)
    staging.remove_stale(target)
    # A failed save leaves its staging folder (never loaded, reported by load and inspect
    # as an interrupted save); the next save to the same target removes it.
    folder = staging.new_staging(target)
    manifest = _write_files(trainer, folder, state, hooks)
    staging.commit(folder, target, hooks=hooks)
    log.info("checkpoint saved to %s (%d files)", target, len(manifest["files"]))
    return manifest


def _write_files(trainer, folder: Path, state: dict, hooks: SaveHooks) -> dict:
    """Write every file of a checkpoint into ``folder``, the manifest last."""
    files: dict[str, dict] = {}
    tables: dict[str, dict] = {}
    for name, config in trainer.tables.items():
        records = trainer.state.client.save(name, str(folder))
        for record in records:
            files[record["name"]] = mf.entry_of(record)
        hooks.after_table_saved(name)
        tables[name] = {
            "config": config.to_dict(),
            "layout": ck.layout_of(config),
            "rows": sum(r["rows"] for r in records if r["kind"] == "rows"),
            "pending": sum(r["rows"] for r in records if r["kind"] == "pending"),
            "files": sorted(r["name"] for r in records),
            "servers": trainer.state.server_num,
        }
        # Deletions not yet in an inference save live only in worker 0's memory: keep
        # them, or a delta saved after a restart would not tombstone those keys.
        tombstones = trainer.state.tombstones(name)
        if tombstones.size:
            record = ck.write_tombstones(folder, name, tombstones)
            files[record["name"]] = mf.entry_of(record)
            tables[name]["tombstones"] = {"file": record["name"], "keys": record["rows"]}
    name = trainer.state.save_dense(folder)
    files[name] = mf.file_record(folder / name)
    dense = {"size": trainer.state.dense_size, "rule": trainer.dense_rule.to_dict(), "file": name}
    full_state = {"passes": trainer.state.passes, "mode": trainer.state.mode_name, **state}
    # the data trained on, for the inference saves of a job resumed from here (model_input)
    recorded = trainer.inference.input
    return mf.write_manifest(
        folder, "sparseps-checkpoint", files, tables=tables, dense=dense, state=full_state,
        input=None if recorded is None else recorded.to_dict(),
    )  # fmt: skip


def load_checkpoint(trainer, directory: str | Path) -> dict:
    """Load a checkpoint saved by any number of servers; returns its ``state`` section."""
    directory = Path(directory).resolve()
    trainer.state.quiesce()
    if not directory.exists():
        raise CheckpointError(staging.missing_report(directory))
    manifest = mf.read_manifest(directory, fmt="sparseps-checkpoint")
    ck.check_tables(directory, manifest["tables"], trainer.tables)
    dense_size = manifest["dense"]["size"]
    if dense_size != trainer.state.dense_size:
        raise CheckpointError(
            f"{directory}: dense model has {dense_size} parameters in the checkpoint, "
            f"the model being loaded has {trainer.state.dense_size}"
        )
    _on_worker_zero(trainer, "load_checkpoint", _load_on_servers, trainer, directory, manifest)
    trainer.state.load_dense_local(directory / manifest["dense"]["file"])
    trainer.state.passes = int(manifest["state"].get("passes", 0))
    trainer.inference.restore(manifest.get("input"))
    return manifest["state"]


def _load_on_servers(trainer, directory: Path, manifest: dict) -> None:
    mf.verify(directory, manifest)
    tombstones = {}
    for name in trainer.tables:
        entry = manifest["tables"][name]
        # every checksum the manifest has: a server verifies the fastest (xxh3_128)
        specs = [{**manifest["files"][f], "path": str(directory / f)} for f in entry["files"]]
        trainer.state.client.load(name, specs)
        if "tombstones" in entry:
            tombstones[name] = ck.read_tombstones(directory / entry["tombstones"]["file"])
    trainer.state.load_dense(directory / manifest["dense"]["file"])
    # the checkpoint's pending deletions replace whatever this process had
    trainer.state.replace_tombstones(tombstones)


def _on_worker_zero(trainer, what: str, function, *args):
    """Run ``function`` on worker 0; every worker returns together, or raises together."""
    result, error = None, None
    if trainer.state.rank == 0:
        try:
            result = function(*args)
        except Exception as exc:  # noqa: BLE001 - re-raised below, on every worker
            error = exc
    failed = collectives.all_reduce_sum(np.array([error is not None], np.int64))[0]
    if error is not None:
        raise error
    if failed:
        raise CheckpointError(f"{what} failed on worker 0 (see its log)")
    return result


def save_inference_model(
    trainer, directory: str | Path, *, mode: str = "base", hooks: SaveHooks = NO_HOOKS
) -> Path | None:
    """Save embeddings (filtered by the lifecycle) and the exported dense head.

    ``base`` writes ``DIR/base-NNNNN`` with rows whose score >= the table's base score;
    ``delta`` writes ``DIR/delta-NNNNN`` with rows changed since the previous inference
    save, plus tombstones of keys shrink deleted since then. Returns the new folder.
    ``hooks``: fault injection for tests (:mod:`.hooks`), called on worker 0.
    """
    if mode not in ("base", "delta"):
        raise CheckpointError(f"save_inference_model: mode must be 'base' or 'delta', got {mode!r}")
    trainer.inference.require()  # a model that cannot be exported: before any server work
    trainer.state.quiesce()
    folder = _on_worker_zero(
        trainer, "save_inference_model", _save_inference, trainer, Path(directory), mode, hooks
    )
    trainer.state.clear_tombstones()
    return folder


def _save_inference(trainer, directory: Path, mode: str, hooks: SaveHooks) -> Path:
    folder = inference.write_inference(trainer, directory, mode, hooks=hooks)
    # The save is on disk: its changed rows are now the chain's (its tombstones are
    # cleared by the caller). Only now may the servers restart their "changed since the
    # last save" marker; a crash before this line repeats the rows in the next delta
    # (harmless upserts) instead of losing them. No push lands between the servers'
    # export and this reset: every worker is held in _on_worker_zero's all-reduce (the
    # consistent cut of quiesce).
    for name in trainer.tables:
        trainer.state.client.commit_inference(name)
    return folder
