"""``RowTier``: a table's rows on disk with the hot ones in memory (issue 14).

Every live row is in memory, on disk, or both. A cache of ``memory_rows`` slots holds the
rows in use; :class:`~sparseps.table.tier_disk.DiskRows` holds a copy of every row that was
ever evicted or loaded (write-back: a changed row reaches the disk when it is evicted or
flushed). The table's key index, its pending keys and the tier's maps (``slot_of`` 4
bytes and ``disk_of`` 8 bytes per row id, ``owner`` 4 bytes per file row) stay in memory.

An op hands the tier the row ids it is about to touch; :meth:`RowTier.slots` promotes the
ones on disk (one compiled pass: CLOCK victims are evicted in the same pass, dirty ones
appended to disk) and returns their slots, and the op then runs the *same* compiled
kernels as an in-memory table, on the cache matrix with slots for ids. So a tiered table
computes bit-identical results by construction: only where a row is stored differs.

Budget: the cache holds ``memory_rows`` rows. An op that touches more distinct rows grows
it for its duration (it pins every row it touches until it ends, so that the slots it
was given stay valid); the next op within the budget shrinks it back.

Room first: :meth:`RowTier.begin` reserves cache slots, file rows and write buffers for
every row an op may touch or write *before* the op changes anything, so a full disk fails
the op with the table unchanged (ResourceError naming the table, the file and the op).

Whole-table passes (decay, shrink, export, delta-score reset) write every buffer out and
then read or write the disk copies through the file's map in file order (a sequential
pass), and the cached copies; the map's pages are dropped from the process after.

Prefetch (hiding the reads): :meth:`RowTier.plan_prefetch` lists the rows of the next
batches that are only on disk, :meth:`PrefetchPlan.read` reads them with no lock held
(the slow part: one ``pread`` each, while pulls and pushes go on), and
:meth:`RowTier.install_prefetch` puts the copies that are still current into the cache
(evicting by CLOCK, off the pull's path) with the rows whose copy was in a write buffer,
and writes full buffers out. A copy is current
when the row is still not cached, its disk copy is where it was read, the segment holding
it was not written since (``DiskRows.seg_gen``), and no whole-table pass ran
(``RowTier._content_gen``); the others are dropped, and counted (``prefetch_stale``)
unless another op promoted them meanwhile.

Concurrency: pulls may run concurrently (the server holds a table's read lock for them)
and a pull moves rows between tiers, so every method that moves rows takes
:attr:`RowTier.lock`; pushes and whole-table ops run under the table's write lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import TableConfig
from ..core.closing import Closing
from ..core.keysets import unique_keys
from ..errors import ConfigError, ResourceError
from . import tier_kernels as kernels
from .growth import Allocator, GrowableMatrix, planned_rows
from .hashmap_kernels import FULL
from .lifecycle import decay_slots
from .tier_disk import DiskRows, grow_map, id_map

__all__ = ["PrefetchPlan", "RowTier", "tier_for"]

# typed loosely: mypy's view of numba's Dispatcher miscounts a call with a star argument
_ensure: Any = kernels.ensure
_pin_hits: Any = kernels.pin_hits
_MAX_SEGMENT_ROWS = 1024
_FLUSH_CHUNK_SEGMENTS = 64  # a flush or load writes out after this many segments
# counts: promoted, evicted, written (ensure's), prefetched, dropped as stale (prefetch's)
_PREFETCHED, _STALE = 3, 4


@dataclass
class PrefetchPlan:
    """Disk rows to promote ahead of their pull: row ``ids`` whose copies are at file
    rows ``where`` (file order) of ``tier``, as of segment generations ``gens`` and
    whole-table generation ``content_gen``; :meth:`read` fills ``rows`` and ``ok``.
    ``in_buffer``: ids whose copy is in a write buffer (nothing to read)."""

    tier: RowTier
    fd: int
    row_bytes: int
    ids: np.ndarray
    where: np.ndarray
    gens: np.ndarray
    content_gen: int
    rows: np.ndarray
    in_buffer: np.ndarray
    ok: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.ok = np.zeros(self.ids.shape[0], np.bool_)

    def read(self) -> None:
        """Read the copies (no lock: nothing of the tier is touched)."""
        kernels.read_rows(self.fd, self.row_bytes, self.where, self.rows, self.ok)


class RowTier(Closing):
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
        self.folder = folder
        self.memory_rows = int(memory_rows)
        self.lock = threading.RLock()
        # segments scale with the budget: a tiny table (tests) compacts tiny segments
        segment = int(min(_MAX_SEGMENT_ROWS, max(8, self.memory_rows // 4)))
        self.disk = DiskRows(folder, table, width, segment, allocator)
        self._cache = GrowableMatrix(self.memory_rows, width, np.float32, allocator)
        self._id_of = np.full(self.memory_rows, -1, np.int64)
        self._ref = np.zeros(self.memory_rows, np.uint8)
        self._dirty = np.zeros(self.memory_rows, np.uint8)
        self._pin = np.full(self.memory_rows, -1, np.int64)
        self._slot_of = id_map(1024, np.int32, allocator)  # per row id
        self._hand = 0
        self._epoch = 0
        # promoted, evicted, written, prefetched, stale (lifetime totals: stats, bench)
        self.counts = np.zeros(5, np.int64)
        self._content_gen = 0  # +1 per whole-table write: voids prefetched copies

    # -- sizes ------------------------------------------------------------------------
    @property
    def cache(self) -> np.ndarray:
        """The cache matrix (re-read after anything that may grow it)."""
        return self._cache.array

    @property
    def path(self) -> str:
        return self.disk.file.path

    @property
    def capacity(self) -> int:
        """Rows the disk file holds before it grows."""
        return self.disk.file.capacity

    @property
    def file_bytes(self) -> int:
        return self.disk.file.nbytes

    @property
    def cached_rows(self) -> int:
        return int(np.count_nonzero(self._id_of >= 0))

    @property
    def nbytes(self) -> int:
        """Memory of the tier: cache, maps and write buffers (the file is not memory)."""
        maps = self._id_of.nbytes + self._ref.nbytes + self._dirty.nbytes + self._pin.nbytes
        return self._cache.nbytes + maps + self._slot_of.nbytes + self.disk.nbytes

    @property
    def _slot_map(self) -> np.ndarray:
        return self._slot_of.array.reshape(-1)

    # -- per-op ------------------------------------------------------------------------
    def begin(self, touched: int, op: str, *, ids: np.ndarray | None = None,
              new_rows: int = 0) -> None:  # fmt: skip
        """Start an op that will touch up to ``touched`` distinct rows (it pins them all):
        room in the cache for all of them, and on disk for each row it may promote or
        create (each may evict a changed row, which is then written to disk): all of
        them, or, given the op's row ``ids`` (-1: none) and the ``new_rows`` it may add,
        the ids not in memory plus ``new_rows``, once the ones in memory are pinned.

        Raises:
            ResourceError: out of memory or disk space, or a write failed; nothing changed.
        """
        self._epoch += 1
        if touched > self._cache.capacity:
            self._grow_cache(touched, op)
        elif self._cache.capacity > self.memory_rows >= touched:
            self._shrink_cache(op)  # a larger op grew it: back to the budget
        misses = touched
        if ids is not None:  # after any shrink: it may have evicted some of them
            pinned = _pin_hits(ids, self._slot_map, self._pin, self._epoch)
            misses = min(touched, int(pinned) + new_rows)
        if misses:  # an op that promotes nothing evicts nothing: no room to make
            self.disk.reserve(misses, op)

    def slots(self, ids: np.ndarray, op: str, *, load: bool = True, dirty: bool = False):
        """int64 slots of the row ids ``ids`` (-1 where ``ids < 0``), promoting rows from disk.

        The op must have called :meth:`begin` with at least the distinct ids it touches.

        Args:
            ids: int64 row ids, -1 for "no row" (repeats allowed).
            op: the op (errors).
            load: read promoted rows from disk (False for new rows the caller writes).
            dirty: the caller will change the rows (they are written back on eviction).

        Raises:
            ResourceError: reading a row from disk failed (the rows are all where they
                were: nothing of the op happened yet).
        """
        n = ids.shape[0]
        out = np.empty(n, np.int64)
        start, disk = 0, self.disk
        while True:
            start, self._hand, status = _ensure(
                ids, start, out, self._slot_map, self._id_of, self._ref, self._dirty,
                self._pin, self._epoch, self._hand, self.cache, disk.fd, disk.row_bytes,
                *disk.state(), load, dirty, self.counts,
            )  # fmt: skip
            if status == 0:
                return out
            if status == 2:
                raise disk.read_error(op, int(disk.disk_of[ids[start]]))
            # every slot is pinned by this op: it touches more rows than it said
            self._grow_cache(self._cache.capacity + (n - start), op)
            disk.reserve(n - start, op)

    def gather_slots(self, ids: np.ndarray, op: str) -> np.ndarray:
        """:meth:`slots` for a reader: an op of its own (the caller holds :attr:`lock`).

        Room is made for the rows not in memory only (each evicts at most one row): a
        pull whose rows were prefetched writes nothing out and compacts nothing."""
        touched = ids.shape[0]
        if touched > self._cache.capacity:  # repeats and absent keys need no slot
            touched = int(unique_keys(ids[ids >= 0]).size)
        self.begin(touched, op, ids=ids)
        return self.slots(ids, op)

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

    def _shrink_cache(self, op: str) -> None:
        """Evict the rows of the slots past the budget (changed ones written to disk)
        and give their memory back; nothing is pinned between ops."""
        keep = self.memory_rows
        try:
            smaller = GrowableMatrix(keep, self.width, np.float32, self._cache.allocator)
        except MemoryError:
            return  # only an optimisation: keep the larger cache
        self.disk.reserve(int(np.count_nonzero(self._dirty[keep:])), op)
        _, written = kernels.flush(keep, self._id_of.shape[0], self.cache, self._id_of,
                                   self._dirty, *self.disk.state())  # fmt: skip
        self.counts[2] += written
        gone = self._id_of[keep:]
        self._slot_map[gone[gone >= 0]] = -1
        self.counts[1] += int(np.count_nonzero(gone >= 0))
        smaller.array[:] = self.cache[:keep]
        self._cache = smaller
        self._id_of, self._ref = self._id_of[:keep].copy(), self._ref[:keep].copy()
        self._dirty, self._pin = self._dirty[:keep].copy(), self._pin[:keep].copy()
        self._hand = 0

    def grow_to(self, needed: int, op: str, *, exact: bool = False) -> None:
        """Room in the per-id maps for row ids ``< needed`` (memory only).

        Raises:
            MemoryError: the maps cannot grow; nothing changed that matters.
        """
        if needed > self._slot_of.capacity:
            rows = needed if exact else planned_rows(self._slot_of.capacity, needed, 12)
            grow_map(self._slot_of, rows)
            self.disk.grow_ids(rows)

    def bytes_to_hold(self, needed: int, *, exact: bool = False) -> int:
        return 12 * max(0, needed - self._slot_of.capacity)

    # -- prefetch ----------------------------------------------------------------------
    def plan_prefetch(self, ids: np.ndarray) -> PrefetchPlan | None:
        """The rows among ``ids`` (-1: none) not in memory: those to read ahead from the
        file, and those whose disk copy is still in a write buffer (copied at install).
        At most half the budget, so that a prefetch never evicts the rows it promotes.
        None when every row is in memory."""
        with self.lock:
            disk, n = self.disk, ids.shape[0]
            read, where, in_buffer = (
                np.empty(n, np.int64),
                np.empty(n, np.int64),
                np.empty(n, np.int64),
            )
            got, buffered = kernels.plan_rows(ids, self._slot_map, disk.disk_of, disk.seg_buf,
                                              disk.seg, max(1, self.memory_rows // 2), read,
                                              where, in_buffer)  # fmt: skip
            if not got + buffered:
                return None
            order = np.argsort(where[:got], kind="stable")  # file order: neighbours together
            read, where = read[:got][order], where[:got][order]
            rows = np.empty((got, self.width), np.float32)
            return PrefetchPlan(self, disk.fd, disk.row_bytes, read, where,
                                disk.seg_gen[where // disk.seg], self._content_gen, rows,
                                in_buffer[:buffered].copy())  # fmt: skip

    def install_prefetch(self, plan: PrefetchPlan) -> int:
        """Cache the read copies of ``plan`` that are still current (module doc; the
        others are counted as stale) and the rows it found in write buffers. Returns the
        rows installed.

        Raises:
            ResourceError: out of memory or disk space making room, or reading a row
                failed (nothing changed).
        """
        with self.lock:
            disk, seg, slot_map = self.disk, self.disk.seg, self._slot_map
            # a restore swaps the table's tier: a plan of the old one is void, and so is
            # every copy read before a whole-table pass
            if plan.tier is not self or plan.content_gen != self._content_gen:
                self.counts[_STALE] += plan.ids.shape[0]
                return 0
            segment = plan.where // seg
            current = plan.ok.copy()
            current &= disk.disk_of[plan.ids] == plan.where
            current &= disk.seg_gen[segment] == plan.gens
            current &= disk.seg_buf[segment] < 0
            current &= slot_map[plan.ids] < 0
            in_buffer = plan.in_buffer[slot_map[plan.in_buffer] < 0]
            ids = plan.ids[current]
            # rows promoted meanwhile (by a pull of the batch before) are where they should be
            self.counts[_STALE] += int(np.count_nonzero(~current & (slot_map[plan.ids] < 0)))
            count = ids.shape[0] + in_buffer.shape[0]
            if not count:
                return 0
            self.begin(count, "prefetch")
            slots = self.slots(ids, "prefetch", load=False)
            self.cache[slots] = plan.rows[current]
            self.counts[0] += ids.shape[0]
            self.slots(in_buffer, "prefetch")  # a copy from memory (ensure reads the buffer)
            self.counts[_PREFETCHED] += count
            disk.write_out("prefetch")  # the evictions' full buffers: not on a pull's path
            return int(count)

    # -- writes and whole-table passes ---------------------------------------------------
    def write(self, ids: np.ndarray, rows: np.ndarray, op: str) -> None:
        """Rows of ``ids`` become ``rows``, where they live (loads: straight to disk, a
        few segments at a time)."""
        chunk = _FLUSH_CHUNK_SEGMENTS * self.disk.seg
        with self.lock:
            self._content_gen += 1
            for at in range(0, ids.shape[0], chunk):
                part = slice(at, at + chunk)
                self.disk.reserve(ids[part].shape[0], op)
                kernels.write_rows(ids[part], rows[part], self._slot_map, self._dirty,
                                   self.cache, *self.disk.state())  # fmt: skip
            self.counts[2] += ids.shape[0]

    def flush(self, op: str) -> None:
        """Write every changed cached row to disk, then every buffer to the file:
        afterwards the file holds every row's latest value."""
        chunk = _FLUSH_CHUNK_SEGMENTS * self.disk.seg
        with self.lock:
            start, left = 0, int(np.count_nonzero(self._dirty))
            while start < self._id_of.shape[0]:
                self.disk.reserve(min(chunk, left), op)
                start, written = kernels.flush(start, chunk, self.cache, self._id_of,
                                               self._dirty, *self.disk.state())  # fmt: skip
                self.counts[2] += written
                left -= written
            self.disk.sync(op)

    def cached(self) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, ids)`` of the occupied cache slots."""
        slots = np.flatnonzero(self._id_of >= 0)
        return slots, self._id_of[slots]

    def scan(self, index, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, ids, file rows, storage)``: every live row of ``index`` with where its
        disk copy is, in file order, and the matrix holding them (the file's map, flushed;
        call :meth:`drop_pages` after reading)."""
        keys, ids = index.items()
        self.flush(op)
        where = self.disk.disk_of[ids]
        order = np.argsort(where, kind="stable")
        return keys[order], ids[order], where[order], self.disk.array

    def locate(self, ids: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(order, file rows, storage)`` of rows ``ids``: their disk copies, flushed, to
        be read in file order (``ids[order]`` sits at ``file rows``; call
        :meth:`drop_pages` after reading). For a few rows of a large table, where
        :meth:`scan` would read every row."""
        self.flush(op)
        where = self.disk.disk_of[ids]
        order = np.argsort(where, kind="stable")
        return order, where[order], self.disk.array

    def decay(self, show_col: int, unseen_col: int, rate: float) -> None:
        """The table's decay on both copies of every row: the disk copies (file order)
        and the cached ones; a clean row's copies stay equal, a dirty one's disk copy is
        superseded when it is written back."""
        with self.lock:
            self._content_gen += 1
            self.disk.sync("decay")
            live = np.flatnonzero(self.disk.owner >= 0)
            decay_slots(np.full(live.size, FULL, np.uint8), live, self.disk.array, show_col,
                        unseen_col, rate)  # fmt: skip
            slots, _ = self.cached()
            decay_slots(np.full(slots.size, FULL, np.uint8), slots, self.cache, show_col,
                        unseen_col, rate)  # fmt: skip
            self.drop_pages()

    def map_rows(self, change) -> None:
        """``change(rows)`` changes float32 rows in place, each by its own values: run it
        on every row's copies (the disk copies, in file order, and the cached ones; a
        superseded disk copy changes harmlessly, it is never read again)."""
        with self.lock:
            self._content_gen += 1
            self.disk.sync("reset_delta_score")
            change(self.disk.array)
            slots, _ = self.cached()
            rows = self.cache[slots]
            change(rows)
            self.cache[slots] = rows
            self.drop_pages()

    def forget(self, ids: np.ndarray) -> None:
        """Rows ``ids`` were deleted: free their slots and zero their disk copies, and
        the superseded copies of every row (so no deleted value stays on disk)."""
        with self.lock:
            self._content_gen += 1
            disk = self.disk
            disk.sync("shrink")
            kernels.forget(ids, self._slot_map, self._id_of, self._ref, self._dirty,
                           disk.array, disk.disk_of, disk.owner, disk.seg_live, disk.seg)  # fmt: skip
            kernels.zero_garbage(disk.array, disk.owner)
            self.drop_pages()

    def drop_pages(self) -> None:
        self.disk.drop_pages()

    def close(self) -> None:
        """Delete the disk file; the tier must not be used afterwards."""
        with self.lock:
            self._content_gen += 1
            self.disk.close()


def tier_for(
    config: TableConfig, width: int, disk_dir: str | None, allocator: Allocator | None,
    *, suffix: str = "", budget_bytes: int | None = None,
) -> RowTier | None:  # fmt: skip
    """The tier of a table with a memory budget (``memory_rows`` or ``memory_bytes``),
    None for an in-memory table. ``suffix`` names a second tier of the table (a split
    table's embedx parts: ``TABLE.embedx`` files); ``budget_bytes``: the bytes of a row
    ``memory_bytes`` is counted in (default the row's own; a split table counts a base
    row and an embedx part, so its two tiers hold as many rows each).

    Raises:
        ConfigError: there is a budget but no disk dir (or it does not exist).
    """
    rows = config.budget_rows(4 * width if budget_bytes is None else budget_bytes)
    if rows is None:
        return None
    if disk_dir is None:
        budget = (
            f"memory_rows={config.memory_rows}"
            if config.memory_rows is not None
            else f"memory_bytes={config.memory_bytes}"
        )
        raise ConfigError(
            f"table {config.name!r} has {budget} but no disk dir to keep the other rows "
            "in: start the servers with --disk-dir DIR (or SPARSEPS_DISK_DIR), or leave "
            "memory_rows and memory_bytes unset to keep every row in memory"
        )
    name = f"{config.name}.{suffix}" if suffix else config.name
    return RowTier(name, width, rows, disk_dir, allocator)
