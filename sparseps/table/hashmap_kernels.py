"""The compiled kernels of :class:`~sparseps.table.hashmap.KeyIndex`: open addressing with
linear probing over three slot arrays (``keys`` uint64, ``ids`` int32, ``state`` uint8).

A key's home slot is ``fastrange(seeded_hash(key, seed))``: the high 32 bits of the hash
times the capacity, shifted down, so any capacity works (the map grows by 1.5x). A slot is
``EMPTY``, ``FULL`` or a ``TOMBSTONE`` (an erased key whose probe chain others may still
cross); occupancy lives in ``state`` so every uint64 is a valid key. The kernels assume
valid input and enough free slots (:meth:`KeyIndex.reserve` grows first); the class keeps
the ids, the free stack and the growth.
"""

from __future__ import annotations

import numpy as np

from ..core.hashing import seeded_hash
from ..core.jit import njit
from ..optim.prefetch import PREFETCH_AHEAD, prefetch

# keys ahead whose home slots a find has asked for: deeper than PREFETCH_AHEAD (rows),
# since a probe is a few instructions and its lines are three small ones
FIND_AHEAD = 16

__all__ = [
    "EMPTY", "FIND_AHEAD", "FULL", "TOMBSTONE", "erase", "find", "find_or_insert", "home",
    "homes", "insert_absent", "items", "prefetch_home", "rehash", "tombstone_first",
]  # fmt: skip

EMPTY, FULL, TOMBSTONE = 0, 1, 2


@njit(nogil=True, cache=True, inline="always")
def home(key, capacity, seed):  # pragma: no cover - compiled
    # fastrange: (high 32 bits of the hash) * capacity >> 32, any capacity < 2**32
    h = seeded_hash(key, seed)
    return np.int64(((h >> np.uint64(32)) * np.uint64(capacity)) >> np.uint64(32))


@njit(nogil=True, cache=True, inline="always")
def prefetch_home(skeys, svals, sstate, keys, k, seed):  # pragma: no cover - compiled
    """Start loading the home slot of ``keys[k]`` (a key a few iterations ahead)."""
    if k < keys.shape[0]:
        i = home(keys[k], skeys.shape[0], seed)
        prefetch(sstate, i, 0)
        prefetch(skeys, i, 0)
        prefetch(svals, i, 0)


@njit(nogil=True, cache=True)
def homes(keys, capacity, seed):  # pragma: no cover - compiled
    """Every key's home slot, in one pass (a loop of independent multiplies the compiler
    vectorises; the probe loop then reads them instead of hashing each key twice)."""
    out = np.empty(keys.shape[0], np.int64)
    for k in range(keys.shape[0]):
        out[k] = home(keys[k], capacity, seed)
    return out


@njit(nogil=True, cache=True)
def find(skeys, svals, sstate, keys, out, seed):  # pragma: no cover - compiled
    # Two phases: the homes first, then the probes with the home slots of the key
    # FIND_AHEAD places on already requested. Measured on a 1M-key index (2-core box,
    # 13k keys a batch): 32 ns a key hashing each key twice and prefetching 8 ahead,
    # 12.5 ns like this (the three slot arrays' lines of 16 keys in flight at once).
    capacity = skeys.shape[0]
    n = keys.shape[0]
    start = homes(keys, capacity, seed)
    for k in range(n):
        if k + FIND_AHEAD < n:
            j = start[k + FIND_AHEAD]
            prefetch(sstate, j, 0)
            prefetch(skeys, j, 0)
            prefetch(svals, j, 0)
        key = keys[k]
        i = start[k]
        result = -1
        while True:
            state = sstate[i]
            if state == EMPTY:
                break
            if state == FULL and skeys[i] == key:
                result = svals[i]
                break
            i += 1
            if i == capacity:
                i = 0
        out[k] = result


@njit(nogil=True, cache=True)
def find_or_insert(
    skeys, svals, sstate, keys, start, out, is_new, free, nfree, next_id, used, limit, size, seed
):  # pragma: no cover - compiled
    capacity = skeys.shape[0]
    for k in range(start, keys.shape[0]):
        if used >= limit:
            # the caller rehashes and resumes at k
            return k, nfree, next_id, used, size
        prefetch_home(skeys, svals, sstate, keys, k + PREFETCH_AHEAD, seed)
        key = keys[k]
        i = home(key, capacity, seed)
        grave = -1
        found = False
        while True:
            state = sstate[i]
            if state == EMPTY:
                break
            if state == FULL:
                if skeys[i] == key:
                    found = True
                    break
            elif grave < 0:
                grave = i
            i += 1
            if i == capacity:
                i = 0
        if found:
            out[k] = svals[i]
            is_new[k] = False
            continue
        if grave >= 0:
            i = grave  # reuse a tombstone: the used count does not change
        else:
            used += 1
        if nfree > 0:
            nfree -= 1
            new_id = free[nfree]
        else:
            new_id = next_id
            next_id += 1
        sstate[i] = FULL
        skeys[i] = key
        svals[i] = new_id
        size += 1
        out[k] = new_id
        is_new[k] = True
    return keys.shape[0], nfree, next_id, used, size


@njit(nogil=True, cache=True)
def tombstone_first(skeys, sstate, keys, count, seed):  # pragma: no cover - compiled
    """Turn the slots of ``keys[:count]`` (all present) into tombstones."""
    capacity = skeys.shape[0]
    for j in range(count):
        s = home(keys[j], capacity, seed)
        while not (sstate[s] == FULL and skeys[s] == keys[j]):
            s = s + 1 if s + 1 < capacity else 0
        sstate[s] = TOMBSTONE


@njit(nogil=True, cache=True)
def insert_absent(skeys, svals, sstate, keys, ids, seed):  # pragma: no cover - compiled
    """``keys[k]`` -> ``ids[k]``, all absent. Returns (first present position or -1, empty
    slots taken); a present key turns the keys inserted before it into tombstones."""
    capacity = skeys.shape[0]
    taken = 0
    for k in range(keys.shape[0]):
        prefetch_home(skeys, svals, sstate, keys, k + PREFETCH_AHEAD, seed)
        key = keys[k]
        i = home(key, capacity, seed)
        grave = -1
        while sstate[i] != EMPTY:
            if sstate[i] == FULL and skeys[i] == key:
                tombstone_first(skeys, sstate, keys, k, seed)  # the live contents as they were
                return k, taken
            if sstate[i] == TOMBSTONE and grave < 0:
                grave = i
            i = i + 1 if i + 1 < capacity else 0
        if grave >= 0:
            i = grave  # a reused tombstone was already a used slot
        else:
            taken += 1
        sstate[i] = FULL
        skeys[i] = key
        svals[i] = ids[k]
    return -1, taken


@njit(nogil=True, cache=True)
def erase(skeys, svals, sstate, keys, out, free, nfree, used, size, seed):  # pragma: no cover
    capacity = skeys.shape[0]
    for k in range(keys.shape[0]):
        key = keys[k]
        i = home(key, capacity, seed)
        out[k] = -1
        while True:
            state = sstate[i]
            if state == EMPTY:
                break
            if state == FULL and skeys[i] == key:
                out[k] = svals[i]
                free[nfree] = svals[i]
                nfree += 1
                size -= 1
                nxt = i + 1 if i + 1 < capacity else 0
                if sstate[nxt] == EMPTY:
                    # the probe chain ends here: no tombstone needed, and the
                    # tombstones just before it are dead too
                    sstate[i] = EMPTY
                    used -= 1
                    j = i - 1 if i > 0 else capacity - 1
                    while sstate[j] == TOMBSTONE:
                        sstate[j] = EMPTY
                        used -= 1
                        j = j - 1 if j > 0 else capacity - 1
                else:
                    sstate[i] = TOMBSTONE
                break
            i += 1
            if i == capacity:
                i = 0
    return nfree, used, size


@njit(nogil=True, cache=True)
def rehash(okeys, ovals, ostate, nkeys, nvals, nstate, seed):  # pragma: no cover - compiled
    capacity = nkeys.shape[0]
    for s in range(okeys.shape[0]):
        if ostate[s] != FULL:
            continue
        key = okeys[s]
        i = home(key, capacity, seed)
        while nstate[i] != EMPTY:
            i += 1
            if i == capacity:
                i = 0
        nstate[i] = FULL
        nkeys[i] = key
        nvals[i] = ovals[s]


@njit(nogil=True, cache=True)
def items(skeys, svals, sstate, out_keys, out_ids):  # pragma: no cover - compiled
    j = 0
    for s in range(skeys.shape[0]):
        if sstate[s] == FULL:
            out_keys[j] = skeys[s]
            out_ids[j] = svals[s]
            j += 1
    return j
