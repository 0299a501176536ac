"""Reading a Paddle PS save (``fleet.save_persistables``, Paddle 2.6): the files only.

A save holds one folder per table id (``000``, ``001``, ... in the order the program
created its tables; the dense table last). A sparse table of Paddle's CTR accessor
(``CtrCommonAccessor``) is gzip text shards ``part-RRR-SSSSS.gz``, one feature a line::

    key slot unseen_days delta_score show click embed_w embed_g2sum... [embedx_w... embedx_g2sum...]

``embed_g2sum``/``embedx_g2sum`` are the state of the parts' rules (one float each for
``SparseAdaGradSGDRule``); the embedx part (its weights, then its rule's state: Paddle
2.6's value layout) is written only for features whose show/click score reached
``embedx_threshold`` (``CtrCommonAccessor::ParseToString``), so lines come in two
lengths; a feature without it starts the rule's state afresh (Paddle's load does too).
A table whose ``embedx_dim`` is 0 writes ``nan`` for its ``embedx_g2sum`` (Paddle divides
by the dim). The dense table (``MemoryDenseTable``) is one
gzip text file, a line per parameter value: the value, then the optimizer's values for it;
the parameters are concatenated in the order of their names.

Worked example (embedx_dim 2; the second feature has not earned its embedx part)::

    8589934592 0 0 28.8 63 25 -0.0073 0.0062 0.0040 0.0155 0.0035
    8589934593 0 0 1.1 2 1 0.0012 0.0004
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CheckpointError

__all__ = ["CtrRows", "read_ctr_table", "read_dense_table", "table_folder"]

# key, slot, unseen_days, delta_score, show, click, embed_w
_HEAD = 7


@dataclass(frozen=True)
class CtrRows:
    """A CTR-accessor table of a Paddle save, field by field (one row per feature).

    Attributes:
        key: uint64 ``[n]``.
        slot, unseen_days, delta_score, show, click, embed_w: float32 ``[n]`` as saved.
        embed_state: float32 ``[n, embed_sgd_dim]`` (``embed_g2sum``).
        embedx_state: float32 ``[n, embedx_sgd_dim]`` (``embedx_g2sum``; zeros where the
            line has no embedx part, NaN where Paddle wrote it for ``embedx_dim`` 0).
        embedx: float32 ``[n, embedx_dim]``, zeros where ``has_embedx`` is False.
        has_embedx: bool ``[n]``: the line holds the feature's embedx weights.
    """

    key: np.ndarray
    slot: np.ndarray
    unseen_days: np.ndarray
    delta_score: np.ndarray
    show: np.ndarray
    click: np.ndarray
    embed_w: np.ndarray
    embed_state: np.ndarray
    embedx_state: np.ndarray
    embedx: np.ndarray
    has_embedx: np.ndarray


def table_folder(save: Path, table_id: int) -> Path:
    """``SAVE/NNN``, the folder of one table of a save.

    Raises:
        CheckpointError: it does not exist.
    """
    folder = Path(save) / f"{table_id:03d}"
    if not folder.is_dir():
        found = sorted(p.name for p in Path(save).iterdir()) if Path(save).is_dir() else []
        raise CheckpointError(
            f"Paddle save {save}: no folder {folder.name} for table id {table_id} "
            f"(found {found}); table ids count the program's tables from 000"
        )
    return folder


def _lines(folder: Path) -> list[bytes]:
    files = sorted(folder.glob("part-*"))
    if not files:
        raise CheckpointError(f"Paddle save: {folder} holds no part-* files")
    lines: list[bytes] = []
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            lines.extend(line for line in f.read().split(b"\n") if line.strip())
    return lines


def read_ctr_table(save: Path, table_id: int, *, embedx_dim: int, embed_sgd_dim: int = 1,
                   embedx_sgd_dim: int = 1) -> CtrRows:  # fmt: skip
    """The rows of a ``CtrCommonAccessor`` table of a Paddle save (module docstring).

    Raises:
        CheckpointError: a line whose length is neither of the two the widths allow, or
            a value that is not a number (names the file's folder and the line).
    """
    folder = table_folder(save, table_id)
    lines = _lines(folder)
    short = _HEAD + embed_sgd_dim
    full = short + embedx_dim + embedx_sgd_dim
    n = len(lines)
    keys = np.empty(n, np.uint64)
    values = np.zeros((n, full - 1), np.float32)
    has = np.zeros(n, np.bool_)
    for i, line in enumerate(lines):  # offline, once per import: a loop over lines
        fields = line.split()
        if len(fields) not in (short, full):
            raise CheckpointError(
                f"Paddle save {folder}: line {i + 1} has {len(fields)} fields, expected "
                f"{short} (without embedx) or {full} (embedx_dim={embedx_dim}): {line[:120]!r}"
            )
        try:
            keys[i] = int(fields[0])
            values[i, : len(fields) - 1] = np.array(fields[1:], np.float32)
        except ValueError as exc:
            raise CheckpointError(f"Paddle save {folder}: line {i + 1}: {exc}") from exc
        has[i] = len(fields) == full and embedx_dim > 0
    at = _HEAD - 1 + embed_sgd_dim
    return CtrRows(
        key=keys, slot=values[:, 0].copy(), unseen_days=values[:, 1].copy(),
        delta_score=values[:, 2].copy(), show=values[:, 3].copy(), click=values[:, 4].copy(),
        embed_w=values[:, 5].copy(),
        embed_state=np.ascontiguousarray(values[:, _HEAD - 1 : at]),
        embedx=np.ascontiguousarray(values[:, at : at + embedx_dim]),
        embedx_state=np.ascontiguousarray(values[:, at + embedx_dim :]), has_embedx=has,
    )  # fmt: skip


def read_dense_table(save: Path, table_id: int) -> np.ndarray:
    """float32 ``[size, 1 + state]``: the dense table's lines (value, optimizer values)."""
    folder = table_folder(save, table_id)
    rows = [np.array(line.split(), np.float32) for line in _lines(folder)]
    widths = {r.size for r in rows}
    if len(widths) != 1:
        raise CheckpointError(f"Paddle save {folder}: dense lines of {sorted(widths)} fields")
    return np.stack(rows)
