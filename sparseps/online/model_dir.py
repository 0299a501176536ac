"""The model directory of an online job and what a restart finds in it.

Layout::

    MODEL_DIR/ledger.jsonl                 completed passes (see sparseps.online.ledger)
    MODEL_DIR/status.json                  running / completed / failed (+ the error)
    MODEL_DIR/checkpoints/SSSSSS-YYYYMMDD-PPP/   one checkpoint per saved pass (MANIFEST last)
    MODEL_DIR/inference/base-NNNNN, delta-NNNNN  the serving chain (sparseps.Predictor)
    MODEL_DIR/predict/SSSSSS-YYYYMMDD-PPP/       a pass's predictions (MANIFEST.json last)
    MODEL_DIR/log/                         per-role logs of the launcher

Every checkpoint goes to a new folder, so a crash mid-save leaves the previous one intact;
only complete ones (valid manifest) count, and the newest ``keep`` are kept. Inference
saves are numbered across bases and deltas; a reader loads the newest complete base and
the deltas after it (:func:`sparseps.checkpoint.inference.chain`), so pruning keeps the
newest ``keep_bases`` bases and everything after the oldest of them.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from ..errors import CheckpointError
from ..files import manifest as mf
from .layout import PassId

__all__ = ["ModelDir"]

log = logging.getLogger(__name__)


class ModelDir:
    """Paths and housekeeping of one online job's model directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"
        self.inference = self.root / "inference"
        self.predictions = self.root / "predict"
        self.status_path = self.root / "status.json"

    def checkpoint_path(self, pass_id: PassId) -> Path:
        return self.checkpoints / f"{pass_id.seq:06d}-{pass_id.day}-{pass_id.index:03d}"

    def complete_checkpoints(self) -> list[tuple[Path, dict]]:
        """Complete checkpoints (path, manifest state), oldest first."""
        found = []
        if self.checkpoints.is_dir():
            for folder in sorted(self.checkpoints.iterdir()):
                # a hidden folder is a save's staging area (sparseps.checkpoint.staging):
                # even with a manifest it was never committed, so it never counts
                if folder.name.startswith(".") or not (folder / mf.MANIFEST).is_file():
                    continue
                try:
                    manifest = mf.read_manifest(folder, fmt="sparseps-checkpoint")
                except CheckpointError as exc:
                    log.warning("ignoring checkpoint %s: %s", folder, exc)
                    continue
                if "online" in manifest.get("state", {}):
                    found.append((folder, manifest["state"]))
        return sorted(found, key=lambda item: item[1]["online"]["seq"])

    def latest_checkpoint(self) -> tuple[Path, dict] | None:
        found = self.complete_checkpoints()
        return found[-1] if found else None

    def predict_path(self, pass_id: PassId) -> Path:
        return self.predictions / f"{pass_id.seq:06d}-{pass_id.day}-{pass_id.index:03d}"

    def rewind_predictions(self, last_seq: int) -> None:
        """Delete prediction folders of passes after ``last_seq`` (they are redone) and
        incomplete ones (no manifest: a crash during the step)."""
        from ..worker.predict import MANIFEST

        if not self.predictions.is_dir():
            return
        for folder in sorted(self.predictions.iterdir()):
            seq = int(folder.name.split("-")[0]) if folder.name[:6].isdigit() else None
            if seq is None or seq > last_seq or not (folder / MANIFEST).is_file():
                log.info("removing prediction folder %s (pass redone or incomplete)", folder)
                shutil.rmtree(folder, ignore_errors=True)

    def prune_predictions(self, keep: int) -> None:
        """Keep the newest ``keep`` prediction folders."""
        if not self.predictions.is_dir():
            return
        for folder in sorted(self.predictions.iterdir())[:-keep]:
            shutil.rmtree(folder, ignore_errors=True)

    def clean_incomplete(self) -> None:
        """Delete what interrupted checkpoint saves left: folders without a manifest and
        hidden staging folders (the online job never saves over an existing checkpoint,
        so none of them holds a checkpoint to put back)."""
        if self.checkpoints.is_dir():
            for folder in self.checkpoints.iterdir():
                hidden = folder.name.startswith(".")
                if folder.is_dir() and (hidden or not (folder / mf.MANIFEST).is_file()):
                    log.info("removing incomplete checkpoint %s", folder)
                    shutil.rmtree(folder, ignore_errors=True)

    def prune(self, keep: int) -> list[Path]:
        """Delete all but the newest ``keep`` complete checkpoints; returns what was deleted."""
        complete = self.complete_checkpoints()
        gone = [path for path, _ in complete[: max(len(complete) - keep, 0)]]
        for path in gone:
            shutil.rmtree(path, ignore_errors=True)
        return gone

    def rewind_inference(self, passes: int) -> list[Path]:
        """Delete inference saves newer than the resumed model (trained passes > ``passes``).

        Their rows came from passes that will be trained again; keeping them would put a
        future model in the serving chain. Incomplete saves go too.
        """
        removed = []
        for _, _, folder in self.inference_saves():
            try:
                state = mf.read_manifest(folder).get("state", {})
                stale = int(state.get("passes", 0)) > passes
            except CheckpointError:
                stale = True
            if stale:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        if removed:
            log.info("removed %d inference saves made after the checkpoint", len(removed))
        return removed

    def inference_saves(self) -> list[tuple[int, str, Path]]:
        """Inference save folders ``(sequence, kind, path)``, complete or not, oldest first."""
        # imported here: that module needs torch, and the `sparseps online` launcher
        # process uses this class without ever loading a model
        from ..checkpoint.inference import saves

        return saves(self.inference)

    def prune_inference(self, keep_bases: int, *, covered_passes: int) -> list[Path]:
        """Delete inference saves older than the ``keep_bases``-th newest complete base.

        Only bases a checkpoint covers count (``state.passes <= covered_passes``): a
        restart deletes saves newer than its checkpoint, and the base chain serving loads
        must survive that. Saves after the oldest kept base (its deltas, newer bases and
        their deltas) are kept. Returns what was deleted.
        """
        if keep_bases < 1:
            raise CheckpointError(
                f"prune_inference: keep_bases must be >= 1 (the newest base's chain is the "
                f"served model), got {keep_bases}"
            )
        saves = self.inference_saves()
        bases = []
        for sequence, kind, folder in saves:
            if kind != "base" or not (folder / mf.MANIFEST).is_file():
                continue
            try:
                passes = int(mf.read_manifest(folder).get("state", {}).get("passes", 0))
            except CheckpointError as exc:
                log.warning("inference save %s does not count as a base: %s", folder, exc)
                continue
            if passes <= covered_passes:
                bases.append(sequence)
        if len(bases) <= keep_bases:
            return []
        cutoff = bases[-keep_bases]
        gone = [folder for sequence, _, folder in saves if sequence < cutoff]
        for folder in gone:
            shutil.rmtree(folder, ignore_errors=True)
        log.info("pruned %d inference saves older than %s", len(gone), f"base-{cutoff:05d}")
        return gone

    def has_base(self) -> bool:
        return self.inference.is_dir() and any(
            (f / mf.MANIFEST).is_file() for f in self.inference.glob("base-*")
        )

    def write_status(self, state: str, **extra) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        mf.write_json_atomic(
            self.status_path,
            {"state": state, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra},
        )
