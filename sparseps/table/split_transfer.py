"""A split table's rows as exchange columns, out and in (:mod:`~sparseps.table.split_rows`
says what the columns hold).

:class:`~sparseps.table.restore.RowTransfer` gathers the base rows' columns as for any
table (``embedding`` ``[n, embed_dim]``, ``state`` of the embed rule, the counters);
:func:`widen` adds each row's embedx part to them (``embedding`` becomes ``[n, dim]``,
``state`` the embed then the embedx state) and ``has_embedx``. :func:`import_split`
upserts such columns: base rows where they live, embedx parts handed out anew (a row's
previous part, if any, is freed first), all room reserved before anything changes.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .columns import scatter_row_columns
from .embedx_push import scores
from .split_rows import embedx_columns, stage_embedx

__all__ = ["embedx_mask", "import_split", "widen"]


def _embedx_rows(storage, ids: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(weights, state, has)`` of the embedx parts of base row ids ``ids``."""
    store = storage.embedx
    xs = store.xids_of(ids)
    if store.tier is None:
        weights, state = embedx_columns(storage, store.rows, xs)
        return weights, state, xs >= 0
    held = np.flatnonzero(xs >= 0)
    slots = np.full(xs.shape[0], -1, np.int64)
    with store.tier.lock:
        order, where, disk = store.tier.locate(xs[held], op)
        slots[held[order]] = where
        weights, state = embedx_columns(storage, disk, slots)
        store.tier.drop_pages()
    return weights, state, xs >= 0


def widen(storage, columns: dict[str, np.ndarray], ids: np.ndarray, op: str) -> dict:
    """Base-row ``columns`` of rows ``ids`` with their embedx parts added (see the module
    docstring); unchanged for a table that is not split."""
    if storage.embedx is None:
        return columns
    weights, state, has = _embedx_rows(storage, ids, op)
    out = dict(columns)
    out["embedding"] = np.ascontiguousarray(np.concatenate([columns["embedding"], weights], 1))
    out["state"] = np.ascontiguousarray(np.concatenate([columns["state"], state], 1))
    out["has_embedx"] = has.astype(np.uint8)
    return out


def embedx_mask(storage, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Which imported rows have an embedx part: ``has_embedx``, or else those whose score
    reaches ``embedx_threshold``."""
    given = cols.get("has_embedx")
    if given is not None:
        return given != 0
    policy = storage.policy
    score = (cols["show"].astype(np.float64) - cols["click"]) * policy.nonclick_coeff
    score += cols["click"].astype(np.float64) * policy.click_coeff
    return score >= storage.config.accessor.embedx_threshold


def import_split(storage, cols: dict[str, np.ndarray], op: str, *, strict: bool,
                 refuse) -> None:  # fmt: skip
    """Upsert checked export columns of a split table (``refuse(op, keys, ids)`` raises
    for present keys when ``strict``)."""
    keys = cols["key"]
    n = keys.size
    if n == 0:
        return
    store, edim = storage.embedx, storage.dim
    esd = storage.layout.state_dim
    ids = storage.index.find(keys)
    if strict:
        refuse(op, keys, ids)
    has = embedx_mask(storage, cols)
    base = dict(cols)
    base["embedding"] = np.ascontiguousarray(cols["embedding"][:, :edim])
    base["state"] = np.ascontiguousarray(cols["state"][:, :esd])
    parts = stage_embedx(storage, cols["embedding"][has, edim:], cols["state"][has, esd:])
    if not np.isfinite(parts[:, store.layout.state_column : store.layout.state_column
                             + store.layout.state_dim]).all():  # fmt: skip
        raise InputError(f"{op}: columns['state'] contains NaN/inf; nothing was imported")
    new = np.flatnonzero(ids < 0)
    tier = storage.tier
    staged = None
    if tier is not None:  # the tier takes whole rows: built aside, first
        staged = np.empty((n, storage.layout.width), np.float32)
        scatter_row_columns(staged, np.arange(n), base, storage.where)
    storage.grow(op, new.size, 0, pending_erases=n, embedx_rows=int(has.sum()))
    if new.size:
        ids[new] = storage.index.find_or_insert(keys[new])[0]
    store.release(ids)  # a row's previous embedx part (if any) is replaced
    xs = store.allocate(parts.shape[0])
    if store.tier is None:
        store.rows[xs] = parts
    else:
        store.tier.write(xs, parts, op)
    store.xids[ids[has]] = xs
    if tier is None:
        scatter_row_columns(storage.rows, ids, base, storage.where)
    else:
        assert staged is not None
        tier.write(ids, staged, op)
    storage.pending_index.erase(keys)


def base_scores(storage, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Scores of base rows (re-exported for full-row writes)."""
    return scores(rows, slots, storage.stat0, storage.policy)
