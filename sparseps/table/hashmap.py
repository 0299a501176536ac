"""``KeyIndex``: a compiled open-addressing map from uint64 keys to compact row ids.

Every uint64 is a valid key, including 0 and 2**64-1, because slot occupancy lives in a
separate ``uint8`` state array (empty / full / tombstone) instead of a reserved key
value. Slots are probed linearly from ``fastrange(splitmix64(key ^ seed))`` (the mixer and the
seeded hash live in :mod:`sparseps.core.hashing`); using the
mixer's high bits with a multiply-shift range reduction lets the capacity be any size, so
the map can grow by 1.5x instead of doubling (memory matters at tens of millions of keys).

The seed is a 64-bit secret drawn from the OS at construction, one per index (kept across
rehashes). splitmix64 is a bijection anyone can invert: without the seed a client could
send keys that all share one home slot and make every insert probe the whole cluster
(quadratic; 120k such keys took ~40x the time of random ones). With it, which keys
collide differs per index and cannot be predicted from the keys. Slot order (``items``)
therefore differs between two indexes holding the same keys; nothing persists it (a
load rebuilds the index). ``mix64`` itself stays unseeded: initial values and admission
draws must be a pure function of (table seed, key).

The map also allocates the ids: a new key gets the most recently freed id (LIFO free
stack) or the next never-used one, so ids stay dense in ``[0, high_water)`` and the row
storage indexed by them reuses the memory of erased rows.

Memory: 13 bytes per slot (8 key + 4 id + 1 state); the load factor stays in
[0.5, 0.75] after growth (ids are int32: at most 2**31 - 1 rows per table shard).

The compiled probing kernels are :mod:`sparseps.table.hashmap_kernels`; this module is the
class around them (the seed, the ids and their free stack, growth and its memory hook).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np

from ..core.hashing import draw_seed
from . import hashmap_kernels as kernels
from .hashmap_kernels import EMPTY

if TYPE_CHECKING:
    from .growth import Allocator

__all__ = ["KeyIndex"]

MAX_LOAD = 0.75  # of used slots (live + tombstones) before a rehash
TARGET_LOAD = 0.5  # live load right after a rehash
MIN_CAPACITY = 8
MAX_IDS = 2**31 - 1


class KeyIndex:
    """uint64 key -> dense int id, with batch find / find-or-insert / erase.

    Not thread-safe for writers: the owning table serialises mutations (the server
    holds a write lock); concurrent ``find`` calls are safe and release the GIL.

    Growth is all-or-nothing: a ``MemoryError`` while rehashing leaves the index as it
    was. :meth:`reserve` grows ahead of a batch so that the insert itself cannot fail.

    Args:
        capacity: initial number of slots (grows automatically).
        seed: the hash secret; None (the default) draws one from the OS.
        allocator: the memory hook (:class:`~sparseps.table.growth.Allocator`).
    """

    def __init__(
        self, capacity: int = 64, *, seed: int | None = None, allocator: Allocator | None = None
    ) -> None:
        from .growth import DEFAULT_ALLOCATOR

        self._allocator = DEFAULT_ALLOCATOR if allocator is None else allocator
        self._seed = draw_seed() if seed is None else np.uint64(seed)
        self._install(*self._alloc_slots(max(MIN_CAPACITY, int(capacity))))
        self._size = 0  # live keys
        self._used = 0  # live keys + tombstones
        self._next_id = 0  # ids in [0, next_id) are live or on the free stack
        self._free = np.empty(0, np.int64)
        self._nfree = 0

    # -- state ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size

    @property
    def seed(self) -> int:
        """The hash secret of this index (differs between indexes)."""
        return int(self._seed)

    @property
    def capacity(self) -> int:
        """Number of hash slots."""
        return self._keys.shape[0]

    @property
    def high_water(self) -> int:
        """One past the largest id ever handed out: storage must hold this many rows."""
        return self._next_id

    @property
    def free_ids(self) -> int:
        """Erased ids waiting for reuse (new keys take these before raising high_water)."""
        return self._nfree

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
        kernels.find(self._keys, self._vals, self._state, keys, out, self._seed)
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
            start, self._nfree, self._next_id, self._used, self._size = kernels.find_or_insert(
                self._keys, self._vals, self._state, keys, start, out, is_new,
                self._free, self._nfree, self._next_id, self._used, self._limit, self._size,
                self._seed,
            )  # fmt: skip
        return out, is_new

    def planned_ids(self, n: int) -> np.ndarray:
        """The ids (int64 [n]) the next ``n`` new keys get, without taking them."""
        take = min(self._nfree, n)
        ids = np.empty(n, np.int64)
        ids[:take] = self._free[self._nfree - take : self._nfree][::-1]
        ids[take:] = np.arange(self._next_id, self._next_id + n - take, dtype=np.int64)
        return ids

    def insert_absent(self, keys: np.ndarray, ids: np.ndarray) -> int:
        """Insert keys that must all be new, with ``ids = planned_ids(len(keys))``: one
        compiled pass, no lookup first (a bulk load proves absence while inserting).

        Returns:
            -1, or the position of the first key already present or repeated; the index
            is then unchanged (but for tombstones where the keys before it went).
        """
        n = keys.shape[0]
        if ids.shape[0] != n:
            raise ValueError(f"insert_absent: {n} keys but {ids.shape[0]} ids")
        self.reserve(n)  # no rehash inside the kernel
        at, taken = kernels.insert_absent(
            self._keys, self._vals, self._state, keys, ids, self._seed
        )
        self._used += taken
        if at >= 0:
            return int(at)
        take = min(self._nfree, n)
        self._nfree -= take
        self._next_id += n - take
        self._size += n
        return -1

    def undo_insert_absent(self, keys: np.ndarray, free_ids_before: int) -> None:
        """Take back a successful :meth:`insert_absent` of ``keys`` (nothing changed the
        index since; ``free_ids_before`` = :attr:`free_ids` before it): the keys are gone,
        their ids planned again, and only tombstones remain where they went."""
        n = keys.shape[0]
        take = min(free_ids_before, n)
        kernels.tombstone_first(self._keys, self._state, keys, n, self._seed)
        self._nfree += take  # the free stack's entries were only uncounted, not changed
        self._next_id -= n - take
        self._size -= n

    def reserve(self, incoming: int, *, erasing: int = 0) -> None:
        """Grow now so that inserting ``incoming`` new keys and erasing ``erasing`` keys
        allocate nothing (so cannot fail half-way). ``MemoryError`` leaves the index as is.
        """
        if self._next_id + incoming - self._nfree > MAX_IDS:
            self._refuse(incoming)
        if self._used + incoming > self._limit:
            self._grow(incoming)
        self._reserve_free(erasing)

    def bytes_to_reserve(self, incoming: int) -> int:
        """Bytes :meth:`reserve` would allocate for ``incoming`` new keys (0 if none)."""
        if self._used + incoming <= self._limit:
            return 0
        return 13 * self._planned_capacity(incoming)

    def erase(self, keys: np.ndarray) -> np.ndarray:
        """Remove ``keys``; returns the freed ids (int64 [n], -1 where absent)."""
        n = keys.shape[0]
        self._reserve_free(n)
        out = np.empty(n, np.int64)
        self._nfree, self._used, self._size = kernels.erase(
            self._keys, self._vals, self._state, keys, out, self._free, self._nfree,
            self._used, self._size, self._seed,
        )  # fmt: skip
        if self.capacity > 1024 and self._size < self.capacity // 8:
            # most keys are gone: give the slot memory back (only an optimisation: the
            # erase is done, so running out of memory here must not fail it)
            with contextlib.suppress(MemoryError):
                self._grow(0)
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All live ``(keys uint64 [size], ids int64 [size])``, in slot order."""
        keys = np.empty(self._size, np.uint64)
        ids = np.empty(self._size, np.int64)
        kernels.items(self._keys, self._vals, self._state, keys, ids)
        return keys, ids

    def clear(self) -> None:
        KeyIndex.__init__(self, MIN_CAPACITY, allocator=self._allocator)

    # -- growth -----------------------------------------------------------------------
    def _alloc_slots(self, capacity: int):
        """New slot arrays (all allocated before any is installed: a failure changes nothing)."""
        empty = self._allocator.empty
        keys = empty(capacity, np.uint64)
        vals = empty(capacity, np.int32)
        state = empty(capacity, np.uint8)
        state[:] = EMPTY
        return keys, vals, state

    def _install(self, keys, vals, state) -> None:
        self._keys, self._vals, self._state = keys, vals, state
        # at least one slot always stays empty so every probe loop terminates
        self._limit = min(int(keys.shape[0] * MAX_LOAD), keys.shape[0] - 1)

    def _reserve_free(self, n: int) -> None:
        if self._free.shape[0] < self._nfree + n:
            grown = self._allocator.empty(max(self._nfree + n, 2 * self._free.shape[0]), np.int64)
            grown[: self._nfree] = self._free[: self._nfree]
            self._free = grown

    def _planned_capacity(self, incoming: int) -> int:
        old = self.capacity
        wanted = max(MIN_CAPACITY, int((self._size + max(incoming, 1)) / TARGET_LOAD) + 1)
        if wanted > old:
            wanted = max(wanted, old + old // 2)  # amortised O(1) per insert
        return min(wanted, 2**32 - 1)

    def _grow(self, incoming: int) -> None:
        """Rehash into a table sized for ``size + incoming`` live keys at TARGET_LOAD."""
        slots = self._alloc_slots(self._planned_capacity(incoming))
        # mypy's view of numba's Dispatcher miscounts a call with a star argument
        kernels.rehash(self._keys, self._vals, self._state, *slots, self._seed)  # type: ignore[call-arg]
        self._install(*slots)
        self._used = self._size

    def _refuse(self, n: int) -> None:
        from ..errors import InputError

        raise InputError(
            f"KeyIndex: inserting {n} keys could exceed {MAX_IDS} rows in one table shard; "
            "use more servers"
        )
