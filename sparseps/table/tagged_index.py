"""``TaggedIndex``: a key index for small rows, 5 bytes per slot plus 8 per row.

:class:`~sparseps.table.hashmap.KeyIndex` keeps the key in each of its slots (13 bytes a
slot at a load of 0.5-0.75: 17-26 bytes per row). That is noise beside today's rows
(80 bytes at dim 8 with Adagrad, 528 at dim 64) but half of a split table's base row
(:class:`~sparseps.config.Accessor`: 24-28 bytes, most features never earn an embedx
part). A ``TaggedIndex`` keeps each key once, by row id (``row_keys``, grown with the
rows), and per slot only a one-byte tag (a slice of the key's hash) and the row id, at a
load of 0.7-0.875: 5.7-7.1 bytes of slots per row, 14-16 with the key. Probing reads
the tags, one byte a slot (the 4-30 slots of a probe at that load are within a cache
line or two), and reads a key only where the tags agree (1 in 254 for another key).

The same contract as ``KeyIndex`` for what a split table uses of it: ``find``,
``contains``, ``find_or_insert`` (dense ids, erased ids reused first), ``erase``,
``items``, ``reserve``/``bytes_to_reserve`` (growth before a batch, all-or-nothing),
``slots`` for whole-table passes (materialised here: 17 bytes per live row for the pass),
a secret seed per index. Kernels: :mod:`~sparseps.table.tagged_kernels`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np

from ..core.hashing import draw_seed
from . import tagged_kernels as kernels
from .hashmap_kernels import FULL
from .tagged_kernels import EMPTY

if TYPE_CHECKING:
    from .growth import Allocator

__all__ = ["TaggedIndex"]

MAX_LOAD = 0.875  # of used slots (live + tombstones) before a rehash
TARGET_LOAD = 0.7  # live load right after a rehash
MIN_CAPACITY = 8
MAX_IDS = 2**31 - 1


class TaggedIndex:
    """uint64 key -> dense int id, keys kept by id (see the module docstring).

    Args:
        capacity: initial number of slots.
        allocator: the memory hook (:class:`~sparseps.table.growth.Allocator`).
    """

    def __init__(self, capacity: int = 64, *, allocator: Allocator | None = None) -> None:
        from .growth import DEFAULT_ALLOCATOR, GrowableMatrix

        self._allocator = DEFAULT_ALLOCATOR if allocator is None else allocator
        self._seed = draw_seed()
        self._install(*self._alloc_slots(max(MIN_CAPACITY, int(capacity))))
        self._row_keys = GrowableMatrix(64, 1, np.uint64, allocator, divisor=8,
                                        doubling_bytes=8 << 20)  # fmt: skip
        self._size = 0
        self._used = 0
        self._next_id = 0
        self._free = np.empty(0, np.int64)
        self._nfree = 0

    # -- state ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size

    @property
    def seed(self) -> int:
        return int(self._seed)

    @property
    def capacity(self) -> int:
        return self._tags.shape[0]

    @property
    def high_water(self) -> int:
        return self._next_id

    @property
    def free_ids(self) -> int:
        return self._nfree

    @property
    def nbytes(self) -> int:
        return (self._tags.nbytes + self._ids.nbytes + self._row_keys.nbytes
                + self._free.nbytes)  # fmt: skip

    @property
    def _keys_by_id(self) -> np.ndarray:
        return self._row_keys.array.reshape(-1)

    def slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, ids, state)`` whose ``FULL`` entries are the live rows (the shape of
        ``KeyIndex.slots``, for whole-table passes; built for the call)."""
        keys, ids = self.items()
        return keys, ids, np.full(keys.shape[0], FULL, np.uint8)

    # -- batch operations -------------------------------------------------------------
    def find(self, keys: np.ndarray) -> np.ndarray:
        """int64 ids of ``keys`` (uint64 [n]); -1 where a key is absent."""
        out = np.empty(keys.shape[0], np.int64)
        kernels.find(self._tags, self._ids, self._keys_by_id, keys, out, self._seed)
        return out

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self.find(keys) >= 0

    def find_or_insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ids of ``keys``, inserting the absent ones: ``(ids int64, is_new bool)``."""
        n = keys.shape[0]
        out = np.empty(n, np.int64)
        is_new = np.empty(n, np.bool_)
        self._reserve_ids(n)
        start = 0
        while start < n:
            if self._used >= self._limit:
                self._grow(n - start)
            start, self._nfree, self._next_id, self._used, self._size = kernels.find_or_insert(
                self._tags, self._ids, self._keys_by_id, keys, start, out, is_new,
                self._free, self._nfree, self._next_id, self._used, self._limit, self._size,
                self._seed,
            )  # fmt: skip
        return out, is_new

    def reserve(self, incoming: int, *, erasing: int = 0) -> None:
        """Grow now so that inserting ``incoming`` new keys and erasing ``erasing`` keys
        allocate nothing. ``MemoryError`` leaves the index as it was."""
        self._reserve_ids(incoming)
        if self._used + incoming > self._limit:
            self._grow(incoming)
        self._reserve_free(erasing)

    def bytes_to_reserve(self, incoming: int) -> int:
        ids = self._row_keys.bytes_to_hold(self._next_id + max(0, incoming - self._nfree))
        if self._used + incoming <= self._limit:
            return ids
        return ids + 5 * self._planned_capacity(incoming)

    def erase(self, keys: np.ndarray) -> np.ndarray:
        """Remove ``keys``; returns the freed ids (int64 [n], -1 where absent)."""
        n = keys.shape[0]
        self._reserve_free(n)
        out = np.empty(n, np.int64)
        self._nfree, self._used, self._size = kernels.erase(
            self._tags, self._ids, self._keys_by_id, keys, out, self._free, self._nfree,
            self._used, self._size, self._seed,
        )  # fmt: skip
        if self.capacity > 1024 and self._size < self.capacity // 8:
            with contextlib.suppress(MemoryError):  # only an optimisation
                self._grow(0)
        return out

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All live ``(keys uint64 [size], ids int64 [size])``, in slot order."""
        keys = np.empty(self._size, np.uint64)
        ids = np.empty(self._size, np.int64)
        kernels.items(self._tags, self._ids, self._keys_by_id, keys, ids)
        return keys, ids

    # -- growth -----------------------------------------------------------------------
    def reserve_rows(self, rows: int) -> None:
        """Keep the keys of row ids ``< rows`` (the table grows them with its rows)."""
        self._row_keys.grow_to(rows, exact=True)

    def _reserve_ids(self, incoming: int) -> None:
        needed = self._next_id + max(0, incoming - self._nfree)
        if needed > MAX_IDS:
            from ..errors import InputError

            raise InputError(
                f"TaggedIndex: inserting {incoming} keys could exceed {MAX_IDS} rows in one "
                "table shard; use more servers"
            )
        self._row_keys.grow_to(needed)

    def _alloc_slots(self, capacity: int):
        empty = self._allocator.empty
        tags = empty(capacity, np.uint8)
        ids = empty(capacity, np.int32)
        tags[:] = EMPTY
        return tags, ids

    def _install(self, tags, ids) -> None:
        self._tags, self._ids = tags, ids
        # at least one slot always stays empty so every probe loop terminates
        self._limit = min(int(tags.shape[0] * MAX_LOAD), tags.shape[0] - 1)

    def _reserve_free(self, n: int) -> None:
        if self._free.shape[0] < self._nfree + n:
            grown = self._allocator.empty(max(self._nfree + n, 2 * self._free.shape[0]), np.int64)
            grown[: self._nfree] = self._free[: self._nfree]
            self._free = grown

    def _planned_capacity(self, incoming: int) -> int:
        old = self.capacity
        wanted = max(MIN_CAPACITY, int((self._size + max(incoming, 1)) / TARGET_LOAD) + 1)
        if wanted > old:
            wanted = max(wanted, old + old // 4)  # amortised O(1) per insert
        return min(wanted, 2**32 - 1)

    def _grow(self, incoming: int) -> None:
        """Rehash into a table sized for ``size + incoming`` live keys at TARGET_LOAD."""
        tags, ids = self._alloc_slots(self._planned_capacity(incoming))
        kernels.rehash(self._tags, self._ids, tags, ids, self._keys_by_id, self._seed)
        self._install(tags, ids)
        self._used = self._size
