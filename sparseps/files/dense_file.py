"""``dense.npz``: the flat dense parameter vector and its optimizer state.

Written by worker 0 (sync mode, where every worker holds the dense optimizer) or by the
server that holds the dense table (async and geo modes). Arrays: ``values`` (float32
``[size]``) and the optimizer state arrays of the rule, as ``DenseTable.export()`` names them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.atomic_file import replaced_atomically

__all__ = ["DENSE_FILE", "load_dense_file", "save_dense_file"]

DENSE_FILE = "dense.npz"


def save_dense_file(directory: Path, arrays: dict[str, np.ndarray]) -> str:
    """Write ``arrays`` (``values`` plus optimizer state) atomically; returns the file name."""
    if "values" not in arrays:
        raise ValueError("save_dense_file: arrays must hold 'values'")
    with replaced_atomically(Path(directory) / DENSE_FILE, sync=True) as tmp, open(tmp, "wb") as f:
        # mypy matches the unpacked dict against savez's `allow_pickle: bool` keyword
        np.savez(f, **{name: np.asarray(array) for name, array in arrays.items()})  # type: ignore[arg-type]
    return DENSE_FILE


def load_dense_file(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name].copy() for name in data.files}
