"""Helpers of the serving tests: deliver a save, read Criteo rows as request rows."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path


def land(save: Path, model_dir: Path) -> Path:
    """Deliver one save the way a writer does: copy aside, then one rename into place."""
    model_dir.mkdir(parents=True, exist_ok=True)
    hidden = model_dir / f".landing-{save.name}"
    shutil.copytree(save, hidden)
    target = model_dir / save.name
    os.rename(hidden, target)
    return target


def criteo_rows(path: Path) -> list[dict]:
    """The rows of a Criteo TSV file as JSON request rows (empty field: null)."""
    from sparseps.data import CRITEO

    rows = []
    with open(path, newline="") as f:
        for fields in csv.reader(f, delimiter="\t"):
            row: dict = {}
            for name, value in zip(CRITEO.columns(), fields, strict=True):
                if name in CRITEO.dense:
                    row[name] = int(value) if value else None
                elif name in CRITEO.slots:
                    row[name] = value or None
            rows.append(row)
    return rows
