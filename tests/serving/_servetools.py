"""Helpers of the serving tests: deliver a save the way a writer does; read `/metrics`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

WORKERS = 2  # processes of the session's service (sparseps serve --workers)


def land(save: Path, model_dir: Path) -> Path:
    """Deliver one save the way a writer does: copy aside, then one rename into place."""
    model_dir.mkdir(parents=True, exist_ok=True)
    hidden = model_dir / f".landing-{save.name}"
    shutil.copytree(save, hidden)
    target = model_dir / save.name
    os.rename(hidden, target)
    return target


def samples(text: str, name: str) -> list[Sample]:
    """The samples called ``name`` in a ``GET /metrics`` answer (every worker's)."""
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
