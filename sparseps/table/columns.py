"""The exchange format of a sparse table's rows: named numpy columns.

``export_rows`` / ``import_rows`` (and the pending variants) speak this format; the
checkpoint code writes it as Arrow/Parquet columns. One row per key::

    key          uint64  [n]
    embedding    float32 [n, dim]
    state        float32 [n, state_dim]     optimizer state (RowLayout.state_columns)
    show, click  float32 [n]
    delta_score  float32 [n]                score gained since the last delta save
    unseen_days  int32   [n]                decays since the row was last pushed
    touched      uint8   [n]  (optional)    1 = pushed since the last decay
    has_embedx   uint8   [n]  (split tables, optional on import)  1 = the row has an
                                            embedx part (docs/table.md, "Accessor")

Pending keys (not admitted yet) export ``key``, ``show``, ``click`` and optionally
``unseen_days`` and ``touched``.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit
from ..core.keysets import has_repeats
from ..errors import InputError
from ..optim.prefetch import PREFETCH_AHEAD, prefetch_row
from . import input_checks as checks

__all__ = [
    "OPTIONAL_PENDING_COLUMNS",
    "OPTIONAL_ROW_COLUMNS",
    "PENDING_COLUMNS",
    "ROW_COLUMNS",
    "SPLIT_ROW_COLUMNS",
    "check_columns",
    "gather_columns",
    "scatter_row_columns",
    "write_stats",
]

ROW_COLUMNS = ("key", "embedding", "state", "show", "click", "unseen_days", "delta_score")
PENDING_COLUMNS = ("key", "show", "click")
OPTIONAL_ROW_COLUMNS = ("touched",)
SPLIT_ROW_COLUMNS = ("has_embedx",)
OPTIONAL_PENDING_COLUMNS = ("unseen_days", "touched")


@njit(nogil=True, cache=True)
def _gather_rows(storage, ids, emb, state, show, click, delta, unseen, touched, stat0):
    # pragma: no cover - compiled
    dim = emb.shape[1]
    sdim = state.shape[1]
    n = ids.shape[0]
    for k in range(n):
        if k + PREFETCH_AHEAD < n:
            prefetch_row(storage, ids[k + PREFETCH_AHEAD], 0, stat0 + 4)
        r = ids[k]
        for j in range(dim):
            emb[k, j] = storage[r, j]
        for j in range(sdim):
            state[k, j] = storage[r, dim + j]
        show[k] = storage[r, stat0]
        click[k] = storage[r, stat0 + 1]
        delta[k] = storage[r, stat0 + 2]
        u = storage[r, stat0 + 3]  # -1: pushed since the last decay (the touched mark)
        unseen[k] = np.int32(u) if u > 0 else 0
        touched[k] = 1 if u < 0 else 0


def _gather_row_columns(storage, keys, ids, where: dict[str, int]) -> dict[str, np.ndarray]:
    """:func:`gather_columns` of full rows in one compiled pass over ``ids`` (a numpy
    gather per column read every row seven times: 2.7 s of a 5M-row save)."""
    n, dim, stat0 = ids.shape[0], where["dim"], where["show"]
    columns = {
        "key": keys,
        "embedding": np.empty((n, dim), np.float32),
        "state": np.empty((n, stat0 - dim), np.float32),
        "show": np.empty(n, np.float32),
        "click": np.empty(n, np.float32),
        "delta_score": np.empty(n, np.float32),
        "unseen_days": np.empty(n, np.int32),
        "touched": np.empty(n, np.uint8),
    }
    _gather_rows(storage, ids, columns["embedding"], columns["state"], columns["show"],
                 columns["click"], columns["delta_score"], columns["unseen_days"],
                 columns["touched"], stat0)  # fmt: skip
    return columns


def gather_columns(storage, keys, ids, where: dict[str, int]) -> dict[str, np.ndarray]:
    """Gather the columns named in ``where`` (name -> first storage column) for ``ids``."""
    stats = [where.get(name) for name in ("show", "click", "delta_score", "unseen")]
    if (
        where.get("dim")
        and stats[0] is not None
        and stats == [stats[0] + i for i in range(4)]
        and type(storage) is np.ndarray  # not a memory map of the disk tier
        and storage.dtype == np.float32
        and storage.ndim == 2
    ):
        return _gather_row_columns(storage, keys, np.asarray(ids), where)
    columns = {"key": keys}
    dim = where.get("dim", 0)
    if dim:
        columns["embedding"] = storage[ids, :dim]
        columns["state"] = storage[ids, dim : where["show"]]
    unseen = storage[ids, where["unseen"]]
    for name in ("show", "click", "delta_score"):
        if name in where:
            columns[name] = storage[ids, where[name]]
    columns["unseen_days"] = np.maximum(unseen, 0).astype(np.int32)
    columns["touched"] = (unseen < 0).astype(np.uint8)
    return columns


def write_stats(storage, ids, cols, where: dict[str, int]) -> None:
    """Write the statistics columns present in both ``cols`` and ``where``."""
    for name in ("show", "click", "delta_score"):
        if name in where:
            storage[ids, where[name]] = cols[name]
    unseen = cols.get("unseen_days")
    unseen = np.zeros(ids.size, np.float32) if unseen is None else unseen.astype(np.float32)
    touched = cols.get("touched")
    if touched is not None:
        unseen = np.where(touched != 0, np.float32(-1.0), unseen)  # -1: pushed since last decay
    storage[ids, where["unseen"]] = unseen


@njit(nogil=True, cache=True)
def _scatter_rows(storage, ids, emb, state, show, click, delta, unseen, touched, stat0):
    # pragma: no cover - compiled
    dim = emb.shape[1]
    sdim = state.shape[1]
    has_touched = touched.shape[0] > 0
    for i in range(ids.shape[0]):
        r = ids[i]
        for j in range(dim):
            storage[r, j] = emb[i, j]
        for j in range(sdim):
            storage[r, dim + j] = state[i, j]
        storage[r, stat0] = show[i]
        storage[r, stat0 + 1] = click[i]
        storage[r, stat0 + 2] = delta[i]
        storage[r, stat0 + 3] = -1.0 if has_touched and touched[i] != 0 else np.float32(unseen[i])


def scatter_row_columns(storage, ids, cols, where: dict[str, int]) -> None:
    """``storage[ids[i]]`` = row ``i`` of checked row columns, in one compiled pass (what
    staging the rows and :func:`write_stats` do, without the staged copy)."""
    stat0 = where["show"]
    assert (where["click"], where["delta_score"], where["unseen"]) == (
        stat0 + 1, stat0 + 2, stat0 + 3,
    ), "the row layout's statistics columns are show, click, delta_score, unseen"  # fmt: skip
    touched = cols.get("touched")
    _scatter_rows(storage, ids, cols["embedding"], cols["state"], cols["show"], cols["click"],
                  cols["delta_score"], cols["unseen_days"],
                  np.empty(0, np.uint8) if touched is None else touched, stat0)  # fmt: skip


COLUMN_TYPES = {
    "key": np.uint64,
    "embedding": np.float32,
    "state": np.float32,
    "show": np.float32,
    "click": np.float32,
    "delta_score": np.float32,
    "unseen_days": np.int32,
    "touched": np.uint8,
    "has_embedx": np.uint8,
}


def check_columns(
    op, columns, required, optional, dim, state_dim, *, values: bool = True
) -> dict[str, np.ndarray]:
    """Validate export-style columns: names, dtypes, shapes, equal lengths, and (unless
    ``values`` is False: the caller's compiled pass checks them) finite values,
    ``unseen_days >= 0`` and unique keys."""
    if not isinstance(columns, dict):
        raise InputError(f"{op}: expected a dict of numpy arrays, found {type(columns).__name__}")
    missing = [name for name in required if name not in columns]
    unknown = sorted(set(columns) - set(required) - set(optional))
    if missing or unknown:
        raise InputError(
            f"{op}: columns must be {list(required)} (optional {list(optional)}); "
            f"missing {missing}, unknown {unknown}"
        )
    keys = checks.check_key_array(op, columns["key"], name="columns['key']")
    n = keys.shape[0]
    result = {"key": keys}
    for name in columns:
        if name == "key":
            continue
        label = f"columns[{name!r}]"
        if name in ("embedding", "state"):
            width = dim if name == "embedding" else state_dim
            result[name] = checks.check_matrix(op, label, columns[name], n, width)
        else:
            result[name] = checks.check_contiguous_vector(
                op, label, columns[name], n, COLUMN_TYPES[name]
            )
        if values and result[name].dtype == np.float32 and not np.isfinite(result[name]).all():
            raise InputError(f"{op}: {label} contains NaN/inf; nothing was imported")
    if not values:
        return result
    if "unseen_days" in result and (result["unseen_days"] < 0).any():
        raise InputError(f"{op}: columns['unseen_days'] must be >= 0; nothing was imported")
    if has_repeats(keys):
        raise InputError(f"{op}: columns['key'] has repeated keys; nothing was imported")
    return result
