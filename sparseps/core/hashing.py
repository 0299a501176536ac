"""The 64-bit mixer and the hashes built on it, in one place.

``mix64`` is splitmix64's finaliser: a bijective 64-bit mixer with full avalanche. Every
reproducible draw in sparseps starts from it - key routing (:mod:`.routing`), initial
values (``sparseps.table.initializers``), admission draws (``sparseps.table.lifecycle``) -
each with its own salt so that the streams stay independent.

``seeded_hash`` mixes ``key ^ seed`` with a secret seed: for structures whose layout
nobody relies on (hash-map slots, per-batch dedup sets). splitmix64 is a bijection anyone
can invert; without the seed a client could send keys that all share one home slot.
"""

from __future__ import annotations

import secrets

import numpy as np

from .jit import njit

__all__ = ["GOLDEN", "draw_seed", "mix64", "mix64_array", "seeded_hash"]

MIX_C1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_C2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: the Weyl step of splitmix64


@njit(nogil=True, cache=True, inline="always")
def mix64(x):  # pragma: no cover - compiled
    """splitmix64 finalizer of one uint64 (compiled; call it from compiled code)."""
    x = (x ^ (x >> np.uint64(30))) * MIX_C1
    x = (x ^ (x >> np.uint64(27))) * MIX_C2
    return x ^ (x >> np.uint64(31))


@njit(nogil=True, cache=True)
def _mix_all(keys, salt):  # pragma: no cover - compiled
    out = np.empty_like(keys)
    for i in range(keys.shape[0]):
        out[i] = mix64(keys[i] ^ salt)
    return out


def mix64_array(keys: np.ndarray, salt: int = 0) -> np.ndarray:
    """``mix64(key ^ salt)`` of every key of a 1-D uint64 array (uint64 out)."""
    keys = np.ascontiguousarray(keys, np.uint64)
    if keys.flags.writeable:
        # numba compiles an overload per writability: a request's keys (a server's, read
        # only) and a worker's (writable) would each compile one on a cold kernel cache,
        # wherever first met (a scale's cut-over). A read-only view: one for every caller.
        keys = keys.view()
        keys.setflags(write=False)
    return _mix_all(keys, np.uint64(salt))


def draw_seed() -> np.uint64:
    """A fresh 64-bit secret for :func:`seeded_hash` (from the OS's CSPRNG)."""
    return np.uint64(secrets.randbits(64))


@njit(nogil=True, cache=True, inline="always")
def seeded_hash(key, seed):  # pragma: no cover - compiled
    """The hash of in-memory hash tables: splitmix64 of ``key ^ seed`` (seed secret).

    Only for structures whose layout nobody relies on (indexes, dedup sets); anything that
    must be reproducible (initial values, admission, routing) uses unseeded mixers.
    """
    return mix64(key ^ seed)
