"""``RowTier``: a table's rows on disk with the hot ones in memory (issue 14).

Every live row has a home on disk: row id ``r`` of the table's
:class:`~sparseps.table.hashmap.KeyIndex` is row ``r`` of a :class:`~sparseps.table.rowfile.RowFile`.
A cache of ``memory_rows`` slots holds copies of the rows in use (write-back: a changed
row reaches the disk when it is evicted or flushed). The index, the pending keys and the
tier's maps stay in memory.

An op hands the tier the row ids it is about to touch; :meth:`RowTier.slots` promotes the
ones on disk (one compiled pass: CLOCK victims are evicted in the same pass, dirty ones
written back) and returns their slots, and the op then runs the *same* compiled kernels
as an in-memory table, on the cache matrix with slots for ids. So a tiered table computes
bit-identical results by construction: only where a row is stored differs.

Budget: the cache holds ``memory_rows`` rows, or the distinct rows of the largest single
op if that is more (an op pins every row it touches until it ends, so that the slots it
was given stay valid); the memory cost per row on disk is the index's and ``slot_of``'s
(about 30 bytes), never the row.

Whole-table passes (decay, shrink, export) run over the disk rows in id order (a
sequential read of the file) after :meth:`RowTier.flush`, and over the cached copies.

Concurrency: pulls may run concurrently (the server holds a table's read lock for them)
and a pull moves rows between tiers, so every method that moves rows takes
:attr:`RowTier.lock`; pushes and whole-table ops run under the table's write lock.
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import ResourceError
from . import tier_kernels as kernels
from .growth import Allocator, GrowableMatrix
from .hashmap import FULL
from .lifecycle import decay_slots
from .rowfile import RowFile

__all__ = ["RowTier"]

# RSS: drop the file's pages from the process once the rows promoted since the last drop
# could span this fraction of the cache's bytes (see RowFile.drop_pages)
_DROP_FRACTION = 0.25
_PAGE = 4096


class RowTier:
    """The memory and disk tiers of one table's rows.

    Args:
        table: table name (errors, file name).
        width: float32 values per row.
        memory_rows: the cache's budget (rows).
        folder: the server's disk dir.
        allocator: the memory hook of the table (see :mod:`sparseps.table.growth`).
    """

    def __init__(
        self, table: str, width: int, memory_rows: int, folder: str, allocator: Allocator | None
    ) -> None:
        self.table = table
        self.width = width
        self.memory_rows = int(memory_rows)
        self.lock = threading.RLock()
        self.file = RowFile(folder, table, width)
        self._allocator = allocator
        self._cache = GrowableMatrix(self.memory_rows, width, np.float32, allocator)
        self._id_of = np.full(self.memory_rows, -1, np.int64)
        self._ref = np.zeros(self.memory_rows, np.uint8)
        self._dirty = np.zeros(self.memory_rows, np.uint8)
        self._pin = np.full(self.memory_rows, -1, np.int64)
        self._slot_of = GrowableMatrix(self.file.capacity, 1, np.int32, allocator)
        self._slot_of.array[:] = -1
        self._hand = 0
        self._epoch = 0
        # promoted, evicted, written back (lifetime totals, for stats and the bench)
        self.counts = np.zeros(3, np.int64)
        self._since_drop = 0

    # -- sizes ------------------------------------------------------------------------
    @property
    def _slot_map(self) -> np.ndarray:
        return self._slot_of.array.reshape(-1)

    @property
    def cache(self) -> np.ndarray:
        """The cache matrix (re-read after anything that may grow it)."""
        return self._cache.array

    @property
    def disk(self) -> np.ndarray:
        return self.file.array

    @property
    def capacity(self) -> int:
        """Rows the disk tier holds before it grows."""
        return self.file.capacity

    @property
    def cached_rows(self) -> int:
        return int(np.count_nonzero(self._id_of >= 0))

    @property
    def nbytes(self) -> int:
        """Memory of the tier: cache, slot maps (the disk file is not memory)."""
        maps = self._id_of.nbytes + self._ref.nbytes + self._dirty.nbytes + self._pin.nbytes
        return self._cache.nbytes + self._slot_of.nbytes + maps

    # -- per-op ------------------------------------------------------------------------
    def begin(self, touched: int, op: str) -> None:
        """Start an op that will touch up to ``touched`` distinct rows (it pins them all).

        Raises:
            ResourceError: the cache cannot grow to hold them; nothing changed.
        """
        self._epoch += 1
        if touched > self._cache.capacity:
            self._grow_cache(touched, op)

    def slots(self, ids: np.ndarray, op: str, *, load: bool = True, dirty: bool = False):
        """int64 slots of the row ids ``ids`` (-1 where ``ids < 0``), promoting rows from disk.

        Args:
            ids: int64 row ids, -1 for "no row" (repeats allowed).
            op: the op (errors).
            load: read promoted rows from disk (False for new rows the caller writes).
            dirty: the caller will change the rows (they are written back on eviction).
        """
        n = ids.shape[0]
        out = np.empty(n, np.int64)
        start = 0
        while True:
            start, self._hand = kernels.ensure(
                ids, start, out, self._slot_map, self._id_of, self._ref,
                self._dirty, self._pin, self._epoch, self._hand, self.cache, self.disk,
                load, dirty, self.counts,
            )  # fmt: skip
            if start == n:
                break
            # every slot is pinned by this op: it touches more rows than the cache holds
            self._grow_cache(self._cache.capacity + (n - start), op)
        self._after_promotions()
        return out

    def gather_slots(self, ids: np.ndarray, op: str) -> np.ndarray:
        """:meth:`slots` for a reader: a new op of its own, under :attr:`lock`."""
        self.begin(0, op)
        return self.slots(ids, op)

    def _after_promotions(self) -> None:
        promoted = int(self.counts[0])
        budget_pages = _DROP_FRACTION * self._cache.nbytes / _PAGE
        if promoted - self._since_drop > max(budget_pages, 1024):
            self.file.drop_pages()
            self._since_drop = promoted

    def _grow_cache(self, rows: int, op: str) -> None:
        old = self._cache.capacity
        try:
            self._cache.grow_to(rows, exact=True)
            extra = self._cache.capacity - old
            self._id_of = np.concatenate([self._id_of, np.full(extra, -1, np.int64)])
            self._ref = np.concatenate([self._ref, np.zeros(extra, np.uint8)])
            self._dirty = np.concatenate([self._dirty, np.zeros(extra, np.uint8)])
            self._pin = np.concatenate([self._pin, np.full(extra, -1, np.int64)])
        except MemoryError as exc:
            raise ResourceError(
                f"{op} on table {self.table!r}: out of memory growing the row cache from {old} "
                f"to {rows} rows ({exc}); nothing was changed"
            ) from exc
        self._hand = old  # the new, free slots come first

    # -- disk growth --------------------------------------------------------------------
    def bytes_to_hold(self, needed: int, *, exact: bool = False) -> int:
        return self._slot_of.bytes_to_hold(needed, exact=exact)

    def grow_to(self, needed: int, op: str, *, exact: bool = False) -> None:
        """Disk rows (and ``slot_of``) for row ids ``< needed``.

        Raises:
            ResourceError: disk full / I/O error (names table, file, op) or out of memory;
                nothing changed (a longer file is harmless).
        """
        self.file.grow_to(needed, op=op, exact=exact)
        old = self._slot_of.capacity
        self._slot_of.grow_to(self.file.capacity, exact=True)
        self._slot_of.array[old:] = -1

    # -- writes and whole-table passes ---------------------------------------------------
    def write(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Rows of ``ids`` (all < capacity) become ``rows``, where they live (loads)."""
        kernels.write_rows(ids, rows, self._slot_map, self._dirty, self.cache,
                           self.disk)  # fmt: skip

    def flush(self) -> int:
        """Write every changed cached row to disk: afterwards the disk holds every row."""
        with self.lock:
            written = int(kernels.flush(self.cache, self._id_of, self._dirty, self.disk))
            self.counts[2] += written
            return written

    def cached(self) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, ids)`` of the occupied cache slots."""
        slots = np.flatnonzero(self._id_of >= 0)
        return slots, self._id_of[slots]

    def forget(self, ids: np.ndarray) -> None:
        """Rows ``ids`` were deleted: free their slots and zero their disk rows."""
        with self.lock:
            kernels.forget(ids, self._slot_map, self._id_of, self._ref, self._dirty,
                           self.disk)  # fmt: skip

    def scan(self, index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, ids, storage)``: every live row of ``index`` in id order and the matrix
        that holds them all (the disk, after a flush), for whole-table reads."""
        keys, ids = index.items()
        order = np.argsort(ids, kind="stable")
        self.flush()
        return keys[order], ids[order], self.disk

    def decay(self, index, show_col: int, unseen_col: int, rate: float) -> None:
        """The table's decay on both copies of every row: the disk rows (in id order) and
        the cached ones; a clean row's copies stay equal, a dirty one's disk copy is
        overwritten when it is written back."""
        with self.lock:
            ids = np.sort(index.items()[1])
            decay_slots(np.full(ids.size, FULL, np.uint8), ids, self.disk, show_col,
                        unseen_col, rate)  # fmt: skip
            slots, _ = self.cached()
            decay_slots(np.full(slots.size, FULL, np.uint8), slots, self.cache, show_col,
                        unseen_col, rate)  # fmt: skip
            self.drop_pages()

    def set_column(self, high_water: int, column: int, value: float) -> None:
        """Column ``column`` of every row (both copies) becomes ``value``."""
        with self.lock:
            self.disk[:high_water, column] = value
            slots, _ = self.cached()
            self.cache[slots, column] = value
            self.drop_pages()

    def drop_pages(self) -> None:
        self.file.drop_pages()
        self._since_drop = int(self.counts[0])

    def close(self) -> None:
        """Delete the disk file; the tier must not be used afterwards."""
        self.file.close()
