"""A split table's rows read and written whole: pulls, and rows as exchange columns.

A split table (:class:`~sparseps.config.Accessor` with an embed part) stores a base row
per key and an embedx part per key that earned one (:mod:`~sparseps.table.embedx`).
What leaves the table is always the whole row, the same shape as a full table's:

- a **pull** returns ``[n, dim]``: the embed part, then the embedx part, or zeros for a
  row without one (Paddle's pull of a feature without its mf part). A key that is not a
  row reads as zeros, except with admission "always", where it reads as its first push
  would create it: the embed initializer's value and, when ``embedx_threshold`` is 0
  (every first push creates the embedx part), the embedx initializer's;
- with ``cvm`` a pull puts each key's show and click in front: ``[n, 2 + dim]`` (any
  table, split or not);
- **export columns** (:mod:`~sparseps.table.columns`): ``embedding`` ``[n, dim]`` as a
  pull gives it, ``state`` ``[n, embed state + embedx state]`` (a row without an embedx
  part shows the embedx rule's initial state), the counters, and ``has_embedx`` uint8
  (1 = the row has an embedx part). On import ``has_embedx`` is optional: without it a
  row has an embedx part when its score reaches ``embedx_threshold``.

Why zeros for a row without an embedx part: such rows are the long tail of rare ids; a
zero vector tells the model "no embedx information" alike for all of them, where the
initializer's random values would feed it noise that no gradient ever corrects (their
gradients are dropped until the part exists). The part, once created, starts from the
initializer's value (see :mod:`~sparseps.table.embedx_push`).
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit
from ..optim.half import floats_to_halves, half_to_float
from .initializers import fill_initial

__all__ = [
    "embedx_columns",
    "fill_missing",
    "missing_rows",
    "pull_cvm",
    "pull_split",
    "stage_embedx",
]


def fill_missing(config, out: np.ndarray, where: np.ndarray, keys: np.ndarray) -> None:
    """Rows ``where`` of a pull's ``out`` (zeros) for keys that are not rows: with
    admission "always" what their first push creates (see the module docstring).

    Args:
        keys: the keys of those rows (``keys[i]`` for ``out[where[i]]``).
    """
    from ..config import Admission

    if config.lifecycle.admission is not Admission.ALWAYS or where.size == 0:
        return
    accessor = config.accessor
    off, edim = 2 * accessor.cvm, accessor.embed_dim
    if not accessor.split:
        fill_initial(out, where, keys, config.dim, config.initializer, config.seed, column=off)
        return
    fill_initial(out, where, keys, edim, accessor.embed_initializer, config.seed, column=off)
    if accessor.embedx_threshold == 0:
        fill_initial(out, where, keys, config.embedx_dim, config.initializer, config.seed,
                     column=off + edim, element=edim)  # fmt: skip


def missing_rows(config, keys: np.ndarray) -> np.ndarray:
    """float32 ``[n, config.pull_dim]``: what a table's pull gives keys that are not rows
    (a predictor's fallback for keys an inference model does not hold)."""
    out = np.zeros((keys.shape[0], config.pull_dim), np.float32)
    fill_missing(config, out, np.arange(keys.shape[0], dtype=np.int64), keys)
    return out


@njit(nogil=True, cache=True)
def _pull_split(base, bslots, xmat, halves, xslots, edim, xdim, wcol, half, stat0, off, out):
    # pragma: no cover - compiled
    missing = 0
    for i in range(bslots.shape[0]):
        r = bslots[i]
        if r < 0:
            missing += 1
            for j in range(out.shape[1]):
                out[i, j] = 0.0
            continue
        if off:
            out[i, 0] = base[r, stat0]
            out[i, 1] = base[r, stat0 + 1]
        for j in range(edim):
            out[i, off + j] = base[r, j]
        x = xslots[i]
        at = off + edim
        if x < 0:
            for j in range(xdim):
                out[i, at + j] = 0.0
        elif half:
            for j in range(xdim):
                out[i, at + j] = half_to_float(halves[x, wcol + j])
        else:
            for j in range(xdim):
                out[i, at + j] = xmat[x, wcol + j]
    return missing


def pull_split(storage, keys, base, bslots, xmat, xslots, out) -> None:
    """Fill ``out`` ``[n, pull_dim]`` with the pulled rows of a split table (see the
    module docstring); ``bslots``/``xslots`` say where each key's base row and embedx
    part are in ``base``/``xmat`` (-1: none)."""
    config = storage.config
    layout = storage.embedx.layout
    edim, off = config.accessor.embed_dim, 2 if config.accessor.cvm else 0
    halves = xmat.view(np.uint16) if layout.half else np.empty((0, 0), np.uint16)
    missing = _pull_split(base, bslots, xmat, halves, xslots, edim, layout.dim,
                          layout.weight_column, layout.half, storage.stat0, off, out)  # fmt: skip
    if missing:
        where = np.flatnonzero(bslots < 0)
        fill_missing(config, out, where, keys[where])


@njit(nogil=True, cache=True)
def _pull_cvm(storage, ids, dim, stat0, out):  # pragma: no cover - compiled
    missing = 0
    for i in range(ids.shape[0]):
        r = ids[i]
        if r < 0:
            missing += 1
            for j in range(dim + 2):
                out[i, j] = 0.0
            continue
        out[i, 0] = storage[r, stat0]
        out[i, 1] = storage[r, stat0 + 1]
        for j in range(dim):
            out[i, 2 + j] = storage[r, j]
    return missing


def pull_cvm(storage, keys, rows, ids, out) -> None:
    """A full table's pull with ``cvm``: ``out[i] = [show, click, embedding...]``."""
    missing = _pull_cvm(rows, ids, storage.dim, storage.stat0, out)
    if missing:
        where = np.flatnonzero(ids < 0)
        fill_missing(storage.config, out, where, keys[where])


def embedx_columns(storage, xmat, xslots) -> tuple[np.ndarray, np.ndarray]:
    """``(weights float32 [n, xdim], state float32 [n, xsd])`` of embedx parts at
    ``xslots`` of ``xmat`` (-1: no part: zeros and the rule's initial state)."""
    store = storage.embedx
    layout = store.layout
    n = xslots.shape[0]
    weights = np.zeros((n, layout.dim), np.float32)
    state = np.empty((n, layout.state_dim), np.float32)
    state[:] = store.state0
    held = np.flatnonzero(xslots >= 0)
    if held.size:
        rows = xmat[xslots[held]]
        sc = layout.state_column
        state[held] = rows[:, sc : sc + layout.state_dim]
        if layout.half:
            halves = np.ascontiguousarray(rows).view(np.uint16)
            first = layout.weight_column
            weights[held] = halves[:, first : first + layout.dim].view(np.float16)
        else:
            weights[held] = rows[:, : layout.dim]
    return weights, state


def stage_embedx(storage, weights: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Stored embedx rows ``[n, words]`` of float32 ``weights`` ``[n, xdim]`` and
    ``state`` ``[n, xsd]`` (float16 storage: each weight rounded to the nearest half;
    exact for weights a float16 table exported)."""
    layout = storage.embedx.layout
    n = weights.shape[0]
    out = np.zeros((n, layout.words), np.float32)
    sc = layout.state_column
    out[:, sc : sc + layout.state_dim] = state
    if layout.half:
        first = layout.weight_column
        halves = out.view(np.uint16)
        floats_to_halves(np.ascontiguousarray(weights), halves[:, first : first + layout.dim])
    else:
        out[:, : layout.dim] = weights
    return out
