"""Deterministic initial rows: a pure function of ``(table seed, key, element)``.

Each element gets its own counter-based random 64-bit word::

    base = splitmix64(key ^ splitmix64(seed ^ SALT))
    word(j) = splitmix64(base + (j + 1) * GOLDEN)

so the same key gets the same vector on any server, in any order, with any number of
shards, and no generator state exists to save or to keep in step. ``uniform`` uses the top
24 bits of the word (exactly the float32 mantissa), ``normal`` the Box-Muller transform of
two 53-bit uniforms (elements ``2m`` and ``2m+1`` share one pair).

Example (dim 4, seed 0, key 42)::

    fill_initial(out, np.arange(1), np.array([42], np.uint64), 4, Initializer.uniform(-1, 1), 0)
"""

from __future__ import annotations

import numpy as np

from ..config import Initializer, InitKind
from ..core.hashing import GOLDEN, mix64
from ..core.jit import njit

__all__ = ["fill_initial", "initial_values", "KIND_CODES"]

KIND_CODES = {InitKind.ZEROS: 0, InitKind.CONSTANT: 1, InitKind.UNIFORM: 2, InitKind.NORMAL: 3}
_INIT_SALT = 0x6A09E667F3BCC908  # keeps init words apart from admission-probability words
_TWO_PI = 2.0 * np.pi


def _params(init: Initializer) -> tuple[int, float, float]:
    kind = KIND_CODES[init.kind]
    if init.kind is InitKind.CONSTANT:
        return kind, init.value, 0.0
    if init.kind is InitKind.UNIFORM:
        return kind, init.low, init.high
    if init.kind is InitKind.NORMAL:
        return kind, init.mean, init.std
    return kind, 0.0, 0.0


@njit(nogil=True, cache=True)
def _fill(target, target_rows, keys, dim, kind, a, b, seed, col0, elem0):  # pragma: no cover
    # element e of a key's vector is written to column col0 + e - elem0
    seed_word = mix64(np.uint64(seed) ^ np.uint64(_INIT_SALT))
    golden = GOLDEN
    for i in range(keys.shape[0]):
        r = target_rows[i]
        if kind == 0:
            for j in range(dim):
                target[r, col0 + j] = 0.0
            continue
        if kind == 1:
            for j in range(dim):
                target[r, col0 + j] = a
            continue
        base = mix64(keys[i] ^ seed_word)
        if kind == 2:
            for j in range(dim):
                word = mix64(base + np.uint64(elem0 + j + 1) * golden)
                u = np.float64(word >> np.uint64(40)) * (1.0 / 16777216.0)  # [0, 1), 24 bits
                target[r, col0 + j] = a + (b - a) * u
            continue
        # normal: Box-Muller on the pairs of elements (2m, 2m + 1); u1 in (0, 1] so log(u1)
        # is finite
        for j in range(dim):
            e = elem0 + j
            pair = e - e % 2
            w1 = mix64(base + np.uint64(pair + 1) * golden)
            w2 = mix64(base + np.uint64(pair + 2) * golden)
            u1 = (np.float64(w1 >> np.uint64(11)) + 1.0) * (1.0 / 9007199254740992.0)
            u2 = np.float64(w2 >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            radius = np.sqrt(-2.0 * np.log(u1))
            if e % 2 == 0:
                target[r, col0 + j] = a + b * radius * np.cos(_TWO_PI * u2)
            else:
                target[r, col0 + j] = a + b * radius * np.sin(_TWO_PI * u2)


def fill_initial(
    target: np.ndarray,
    target_rows: np.ndarray,
    keys: np.ndarray,
    dim: int,
    init: Initializer,
    seed: int,
    *,
    column: int = 0,
    element: int = 0,
) -> None:
    """Write the initial vector of ``keys[i]`` into ``target[target_rows[i], :dim]``.

    With ``column``/``element``: elements ``element .. element + dim - 1`` of each key's
    vector go to columns ``column ..`` (a split row's embedx part is elements
    ``embed_dim ..`` of the vector a pull returns, wherever it is stored).

    Args:
        target: float32 2-D array (a table's row storage or an output batch).
        target_rows: int64 ``[n]`` rows of ``target`` to write.
        keys: uint64 ``[n]``.
        dim: number of leading columns to write.
        init: the initializer.
        seed: the table seed, ``[0, 2**64)``.
    """
    kind, a, b = _params(init)
    _fill(target, target_rows, keys, dim, kind, a, b, np.uint64(seed), column, element)


def initial_values(keys: np.ndarray, dim: int, init: Initializer, seed: int) -> np.ndarray:
    """float32 ``[n, dim]``: the initial vectors of ``keys`` (uint64 ``[n]``)."""
    out = np.empty((keys.shape[0], dim), np.float32)
    fill_initial(out, np.arange(keys.shape[0], dtype=np.int64), keys, dim, init, seed)
    return out
