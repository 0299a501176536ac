"""Compiled per-batch passes of the sparse table: merge duplicates, gather, new rows, stats.

Each function makes one pass over a batch and assumes validated input (the table's
public methods check dtypes, shapes and finiteness first).
"""

from __future__ import annotations

import numpy as np

from ..core.hashing import draw_seed
from ..core.jit import njit
from ..core.keysets import first_seen
from ..optim.numerics import F32_MAX, fit32
from ..optim.prefetch import PREFETCH_AHEAD, prefetch_row

# rows ahead a pull's gather asks for: a gather does no arithmetic between misses, so it
# needs more in flight than the rules' kernels (13k rows of a 1M-row table on the 2-core
# box: 16.5 ns a row at 8 ahead, 13.5 at 16; 10M rows: 20.5 and 16)
GATHER_AHEAD = 16

__all__ = ["add_rows", "dedup_merge", "gather", "init_rows", "touch_rows"]


@njit(nogil=True, cache=True)
def _dedup_merge(keys, values, shows, clicks, seed):  # pragma: no cover - compiled
    uniq, inverse = first_seen(keys, seed)
    u = uniq.shape[0]
    dim = values.shape[1]
    merged = np.empty((u, dim), np.float32)
    merged_shows = np.empty(u, np.float32)
    merged_clicks = np.empty(u, np.float32)
    seen = 0
    for i in range(keys.shape[0]):
        j = inverse[i]
        if j == seen:  # a key's first occurrence (the keys are numbered in that order)
            for d in range(dim):
                merged[j, d] = values[i, d]
            merged_shows[j] = shows[i]
            merged_clicks[j] = clicks[i]
            seen += 1
        else:
            for d in range(dim):
                merged[j, d] += values[i, d]
            merged_shows[j] += shows[i]
            merged_clicks[j] += clicks[i]
    return uniq, merged, merged_shows, merged_clicks


def dedup_merge(keys, values, shows, clicks):
    """Merge repeated keys: ``(unique keys, summed values, summed shows, summed clicks)``.

    Unique keys keep the order of their first occurrence; sums run in occurrence order.
    The batch-local hash set is seeded afresh per call, so a client cannot craft keys that
    all collide in it (the result does not depend on the seed).
    """
    return _dedup_merge(keys, values, shows, clicks, draw_seed())


@njit(nogil=True, cache=True)
def _gather(storage, ids, dim, out):  # pragma: no cover - compiled
    missing = 0
    n = ids.shape[0]
    for i in range(n):
        if i + GATHER_AHEAD < n and ids[i + GATHER_AHEAD] >= 0:
            prefetch_row(storage, ids[i + GATHER_AHEAD], 0, dim)
        r = ids[i]
        if r >= 0:
            for j in range(dim):
                out[i, j] = storage[r, j]
        else:
            missing += 1
            for j in range(dim):
                out[i, j] = 0.0
    return missing


def gather(
    storage: np.ndarray, ids: np.ndarray, dim: int, out: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """``(out float32 [n, dim], number of ids < 0)``: embeddings of ``ids``, zeros for -1
    (into ``out`` when given: a C-contiguous float32 ``[n, dim]``)."""
    if out is None:
        out = np.empty((ids.shape[0], dim), np.float32)
    missing = _gather(storage, ids, dim, out)
    return out, missing


@njit(nogil=True, cache=True)
def init_rows(
    storage, rows, state0, shows, clicks, dim, stat0, nonclick, click_coeff
):  # pragma: no cover
    """Set the state and statistics of new ``rows`` (the embedding is filled separately).

    Statistics start from the key's admission counters ``shows``/``clicks`` (zeros for
    admission "always"); delta_score starts at their score; unseen at 0.
    """
    sd = state0.shape[0]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(sd):
            storage[r, dim + j] = state0[j]
        s = shows[i]
        c = clicks[i]
        storage[r, stat0] = s
        storage[r, stat0 + 1] = c
        storage[r, stat0 + 2] = (s - c) * nonclick + c * click_coeff
        storage[r, stat0 + 3] = 0.0


@njit(nogil=True, cache=True)
def touch_row(storage, r, s, c, stat0, nonclick, click_coeff):  # pragma: no cover
    """Row ``r``'s part of :func:`touch_rows` (the push's fused kernel calls it too)."""
    storage[r, stat0] = fit32(storage[r, stat0] + s)
    storage[r, stat0 + 1] = fit32(storage[r, stat0 + 1] + c)
    storage[r, stat0 + 2] = fit32(storage[r, stat0 + 2] + ((s - c) * nonclick + c * click_coeff))
    storage[r, stat0 + 3] = -1.0


@njit(nogil=True, cache=True)
def touch_rows(storage, rows, shows, clicks, stat0, nonclick, click_coeff):  # pragma: no cover
    """Add a push's shows/clicks, its score increment to delta_score, mark pushed (-1).

    The counters saturate at float32's max (a counter near its limit stays there instead
    of becoming inf), so this never makes a row non-finite.
    """
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], stat0, 4)
        r = rows[i]
        s = np.float64(shows[i])
        c = np.float64(clicks[i])
        touch_row(storage, r, s, c, stat0, nonclick, click_coeff)


@njit(nogil=True, cache=True)
def add_rows(storage, rows, deltas, dim):  # pragma: no cover - compiled
    """Geo mode: ``embedding += delta`` for each row (no optimizer rule, no saturation).

    Returns whether every written value is finite (a sum can overflow float32: the
    table then rejects the push and restores the rows).
    """
    finite = True
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, dim)
        r = rows[i]
        for j in range(dim):
            x = storage[r, j] + deltas[i, j]
            finite &= abs(x) <= F32_MAX
            storage[r, j] = x
    return finite
