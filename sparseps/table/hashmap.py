"""``KeyIndex``: a compiled open-addressing map from uint64 keys to compact row ids.

Every uint64 is a valid key, including 0 and 2**64-1, because slot occupancy lives in a
separate ``uint8`` state array (empty / full / tombstone) instead of a reserved key
value. Slots are probed linearly from ``fastrange(splitmix64(key))``; using the mixer's
high bits with a multiply-shift range reduction lets the capacity be any size, so the
map can grow by 1.5x instead of doubling (memory matters at tens of millions of keys).

The map also allocates the ids: a new key gets the most recently freed id (LIFO free
stack) or the next never-used one, so ids stay dense in ``[0, high_water)`` and the row
storage indexed by them reuses the memory of erased rows.

Memory: 13 bytes per slot (8 key + 4 id + 1 state); the load factor stays in
[0.5, 0.75] after growth (ids are int32: at most 2**31 - 1 rows per table shard).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..optim.prefetch import PREFETCH_AHEAD, prefetch

__all__ = ["KeyIndex", "mix64"]

EMPTY, FULL, TOMBSTONE = 0, 1, 2
MAX_LOAD = 0.75  # of used slots (live + tombstones) before a rehash
TARGET_LOAD = 0.5  # live load right after a rehash
MIN_CAPACITY = 8
MAX_IDS = 2**31 - 1


@njit(nogil=True, cache=True, inline="always")
def mix64(x):  # pragma: no cover - compiled
    """splitmix64 finalizer: a bijective 64-bit mixer with full avalanche."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(nogil=True, cache=True, inline="always")
def _home(key, capacity):  # pragma: no cover - compiled
    # fastrange: (high 32 bits of the hash) * capacity >> 32, any capacity < 2**32
    return np.int64(((mix64(key) >> np.uint64(32)) * np.uint64(capacity)) >> np.uint64(32))


@njit(nogil=True, cache=True, inline="always")
def _prefetch_home(skeys, svals, sstate, keys, k):  # pragma: no cover - compiled
    """Start loading the home slot of ``keys[k]`` (a key a few iterations ahead)."""
    if k < keys.shape[0]:
        i = _home(keys[k], skeys.shape[0])
        prefetch(sstate, i, 0)
        prefetch(skeys, i, 0)
        prefetch(svals, i, 0)


@njit(nogil=True, cache=True)
def _find(skeys, svals, sstate, keys, out):  # pragma: no cover - compiled
    capacity = skeys.shape[0]
    for k in range(keys.shape[0]):
        _prefetch_home(skeys, svals, sstate, keys, k + PREFETCH_AHEAD)
        key = keys[k]
        i = _home(key, capacity)
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
def _find_or_insert(
    skeys, svals, sstate, keys, start, out, is_new, free, nfree, next_id, used, limit, size
):  # pragma: no cover - compiled
    capacity = skeys.shape[0]
    for k in range(start, keys.shape[0]):
        if used >= limit:
            # the caller rehashes and resumes at k
            return k, nfree, next_id, used, size
        _prefetch_home(skeys, svals, sstate, keys, k + PREFETCH_AHEAD)
        key = keys[k]
        i = _home(key, capacity)
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
def _erase(skeys, svals, sstate, keys, out, free, nfree, used, size):  # pragma: no cover
    capacity = skeys.shape[0]
    for k in range(keys.shape[0]):
        key = keys[k]
        i = _home(key, capacity)
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
def _rehash(okeys, ovals, ostate, nkeys, nvals, nstate):  # pragma: no cover - compiled
    capacity = nkeys.shape[0]
    for s in range(okeys.shape[0]):
        if ostate[s] != FULL:
            continue
        key = okeys[s]
        i = _home(key, capacity)
        while nstate[i] != EMPTY:
            i += 1
            if i == capacity:
                i = 0
        nstate[i] = FULL
        nkeys[i] = key
        nvals[i] = ovals[s]


@njit(nogil=True, cache=True)
def _items(skeys, svals, sstate, out_keys, out_ids):  # pragma: no cover - compiled
    j = 0
    for s in range(skeys.shape[0]):
        if sstate[s] == FULL:
            out_keys[j] = skeys[s]
            out_ids[j] = svals[s]
            j += 1
    return j


class KeyIndex:
    """uint64 key -> dense int id, with batch find / find-or-insert / erase.

    Not thread-safe for writers: the owning table serialises mutations (the server
    holds a write lock); concurrent ``find`` calls are safe and release the GIL.

    Args:
        capacity: initial number of slots (grows automatically).
    """

    def __init__(self, capacity: int = 64) -> None:
        self._alloc_slots(max(MIN_CAPACITY, int(capacity)))
        self._size = 0  # live keys
        self._used = 0  # live keys + tombstones
        self._next_id = 0  # ids in [0, next_id) are live or on the free stack
        self._free = np.empty(0, np.int64)
        self._nfree = 0

    # -- state ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size

    @property
    def capacity(self) -> int:
        """Number of hash slots."""
        return self._keys.shape[0]

    @property
    def high_water(self) -> int:
        """One past the largest id ever handed out: storage must hold this many rows."""
        return self._next_id

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._vals.nbytes + self._state.nbytes + self._free.nbytes

    def slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The raw ``(keys, ids, state)`` slot arrays, for compiled whole-table passes."""
        return self._keys, self._vals, self._state

    # -- batch operations -----------------------------------------------------------------
    def find(self, keys: np.ndarray) -> np.ndarray:
        """int64 ids of ``keys`` (uint64 [n]); -1 where a key is absent."""
        out = np.empty(keys.shape[0], np.int64)
        _find(self._keys, self._vals, self._state, keys, out)
        return out

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self.find(keys) >= 0

    def find_or_insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ids of ``keys``, inserting the absent ones.

        Returns:
            ``(ids int64 [n], is_new bool [n])``; a key repeated in the batch is new only
            at its first occurrence.
        """
        n = keys.shape[0]
        out = np.empty(n, np.int64)
        is_new = np.empty(n, np.bool_)
        if self._next_id + n - self._nfree > MAX_IDS:
            self._refuse(n)
        start = 0
        while start < n:
            if self._used >= self._limit:
                self._grow(n - start)
            start, self._nfree, self._next_id, self._used, self._size = _find_or_insert(
                self._keys, self._vals, self._state, keys, start, out, is_new,
                self._free, self._nfree, self._next_id, self._used, self._limit, self._size,
            )  # fmt: skip
        return out, is_new

    def erase(self, keys: np.ndarray) -> np.ndarray:
        """Remove ``keys``; returns the freed ids (int64 [n], -1 where absent)."""
        n = keys.shape[0]
        if self._free.shape[0] < self._nfree + n:
            grown = np.empty(max(self._nfree + n, 2 * self._free.shape[0]), np.int64)
            grown[: self._nfree] = self._free[: self._nfree]
            self._free = grown
        out = np.empty(n, np.int64)
        self._nfree, self._used, self._size = _erase(
            self._keys, self._vals, self._state, keys, out, self._free, self._nfree,
            self._used, self._size,
        )  # fmt: skip
        if self.capacity > 1024 and self._size < self.capacity // 8:
            self._grow(0)  # most keys are gone: give the slot memory back
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All live ``(keys uint64 [size], ids int64 [size])``, in slot order."""
        keys = np.empty(self._size, np.uint64)
        ids = np.empty(self._size, np.int64)
        _items(self._keys, self._vals, self._state, keys, ids)
        return keys, ids

    def clear(self) -> None:
        self.__init__(MIN_CAPACITY)

    # -- growth -----------------------------------------------------------------------
    def _alloc_slots(self, capacity: int) -> None:
        self._keys = np.empty(capacity, np.uint64)
        self._vals = np.empty(capacity, np.int32)
        self._state = np.zeros(capacity, np.uint8)
        # at least one slot always stays empty so every probe loop terminates
        self._limit = min(int(capacity * MAX_LOAD), capacity - 1)

    def _grow(self, incoming: int) -> None:
        """Rehash into a table sized for ``size + incoming`` live keys at TARGET_LOAD."""
        old = self.capacity
        wanted = max(MIN_CAPACITY, int((self._size + max(incoming, 1)) / TARGET_LOAD) + 1)
        if wanted > old:
            wanted = max(wanted, old + old // 2)  # amortised O(1) per insert
        okeys, ovals, ostate = self._keys, self._vals, self._state
        self._alloc_slots(min(wanted, 2**32 - 1))
        _rehash(okeys, ovals, ostate, self._keys, self._vals, self._state)
        self._used = self._size

    def _refuse(self, n: int) -> None:
        from ..errors import InputError

        raise InputError(
            f"KeyIndex: inserting {n} keys could exceed {MAX_IDS} rows in one table shard; "
            "use more servers"
        )
