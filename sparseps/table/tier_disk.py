"""``DiskRows``: where a tiered table's rows live on disk, and the space they take.

The row file (:class:`~sparseps.table.rowfile.RowFile`) is cut into segments of
``segment_rows`` rows. Rows are appended log-style (:mod:`~sparseps.table.tier_kernels`):
into the write buffer of the current segment, which reaches the file whole, one
``pwrite`` per segment, when :meth:`DiskRows.reserve` (called before every op) or
:meth:`DiskRows.sync` writes the full buffers out. A row's previous copy becomes garbage;
a segment without live copies is reused, and when the file holds more than
``GARBAGE_FACTOR`` times the live copies the emptiest segments are compacted (their live
copies appended again) instead of growing the file.

All-or-nothing towards the table: :meth:`DiskRows.reserve` makes room (file rows and
buffers) for every append an op may do *before* the op changes anything, and a write
that fails leaves its rows in their buffer (memory) and raises
:class:`~sparseps.errors.ResourceError` naming the table, the file and the op; the next
op tries again.

Memory: ``disk_of`` (8 bytes per row id), ``owner`` (4 bytes per file row), the buffers
(a segment each, a few per op) and a few ints per segment.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..core.closing import Closing
from ..errors import ResourceError
from . import tier_kernels as kernels
from .growth import Allocator, GrowableMatrix, planned_rows
from .rowfile import RowFile

__all__ = ["GARBAGE_FACTOR", "DiskRows"]

GARBAGE_FACTOR = 2  # compact rather than grow once the file holds 2x the live copies


def id_map(rows: int, dtype, allocator) -> GrowableMatrix:
    """A growable 1-column map filled with -1."""
    matrix = GrowableMatrix(rows, 1, dtype, allocator)
    matrix.array[:] = -1
    return matrix


def grow_map(matrix: GrowableMatrix, rows: int) -> None:
    old = matrix.capacity
    matrix.grow_to(rows, exact=True)
    matrix.array[old:] = -1


class DiskRows(Closing):
    """The disk tier of one table (see module doc).

    Args:
        folder: the server's disk dir.
        table: table name (file name, errors).
        width: float32 values per row.
        segment_rows: rows per segment (the unit of writes and of space reuse).
        allocator: the table's memory hook.
    """

    def __init__(
        self, folder: str, table: str, width: int, segment_rows: int, allocator: Allocator | None
    ) -> None:
        self.table = table
        self.width = width
        self.seg = int(segment_rows)
        self.file = RowFile(folder, table, width, 4 * self.seg)
        self.row_bytes = self.file.row_bytes
        self._disk_of = id_map(1024, np.int64, allocator)
        self._owner = id_map(self.file.capacity, np.int32, allocator)
        self.seg_live = np.zeros(self.file.capacity // self.seg, np.int32)
        self.seg_buf = np.full(self.seg_live.size, -1, np.int32)
        # per segment: how many times its rows were written to the file (a prefetch read
        # without the lock is still the row's copy while this has not moved)
        self.seg_gen = np.zeros(self.seg_live.size, np.int64)
        self.bufs = np.empty((0, self.seg, width), np.float32)
        self.buf_seg = np.empty(0, np.int64)
        self.front = np.zeros(3, np.int64)  # empty: the first append starts a segment
        self.moved = 0  # rows moved by compaction (lifetime)

    # -- state ------------------------------------------------------------------------
    @property
    def owner(self) -> np.ndarray:
        # exactly one entry per file row (the map may be longer after a failed growth)
        return self._owner.array.reshape(-1)[: self.file.capacity]

    @property
    def disk_of(self) -> np.ndarray:
        return self._disk_of.array.reshape(-1)

    def state(self) -> tuple[Any, ...]:
        """The arrays every appending kernel takes, in kernel order."""
        return (self.bufs, self.seg_buf, self.buf_seg, self.disk_of, self.owner, self.seg_live,
                self.front, self.seg)  # fmt: skip

    @property
    def fd(self) -> int:
        return self.file.fd

    @property
    def nbytes(self) -> int:
        """Memory (the file is not memory)."""
        maps = (
            self._disk_of.nbytes + self._owner.nbytes + self.seg_live.nbytes + self.seg_gen.nbytes
        )
        return maps + self.seg_buf.nbytes + self.bufs.nbytes + self.buf_seg.nbytes

    @property
    def live_copies(self) -> int:
        return int(self.seg_live.sum())

    def grow_ids(self, needed: int) -> None:
        """``disk_of`` for row ids ``< needed`` (MemoryError leaves it as it was)."""
        if needed > self._disk_of.capacity:
            grow_map(self._disk_of, needed)

    # -- room -------------------------------------------------------------------------
    def _front_segment(self) -> int:
        return int(self.front[0] - 1) // self.seg if self.front[0] > 0 else -1

    def free_rows(self) -> int:
        """Appends that find room without growing: the front's rest and free segments."""
        free = np.count_nonzero((self.seg_live == 0) & (self.seg_buf < 0))
        return int(self.front[1] - self.front[0]) + self.seg * int(free)

    def reserve(self, rows: int, op: str) -> None:
        """Room for ``rows`` appends: full buffers written out, free file rows (compacting
        or growing the file) and free buffers.

        Raises:
            ResourceError: a write or the growth failed (disk full, I/O error) or memory
                ran out; the table's rows are all still where they were.
        """
        self.write_out(op)
        if self.free_rows() < rows:
            seg = self.seg
            if self.file.capacity >= GARBAGE_FACTOR * (self.live_copies + rows) + 4 * seg:
                if self.free_rows() < 2 * seg:  # compaction needs a little room of its own
                    self._grow_file(self.file.capacity + 2 * seg, op)
                self._compact(rows, op)
            if self.free_rows() < rows:
                needed = self.file.capacity + rows + seg
                self._grow_file(planned_rows(self.file.capacity, needed, self.row_bytes), op)
        buffers = 2 + -(-rows // self.seg)
        free = int(np.count_nonzero(self.buf_seg < 0))
        if free < buffers:
            self._add_buffers(buffers - free, op)

    def _add_buffers(self, count: int, op: str) -> None:
        try:
            more = np.empty((count, self.seg, self.width), np.float32)
            self.bufs = np.concatenate([self.bufs, more])
        except MemoryError as exc:
            raise ResourceError(
                f"{op} on table {self.table!r}: out of memory for {count} write buffer(s) of "
                f"{self.seg} rows ({exc}); nothing was changed"
            ) from exc
        self.buf_seg = np.concatenate([self.buf_seg, np.full(count, -1, np.int64)])

    def _grow_file(self, rows: int, op: str) -> None:
        seg = self.seg
        target = -(-rows // seg) * seg
        try:
            grow_map(self._owner, target)
        except MemoryError as exc:
            raise ResourceError(f"{op} on table {self.table!r}: out of memory ({exc})") from exc
        self.file.grow_to(target, op=op, exact=True)
        extra = target // seg - self.seg_live.size
        self.seg_live = np.concatenate([self.seg_live, np.zeros(extra, np.int32)])
        self.seg_buf = np.concatenate([self.seg_buf, np.full(extra, -1, np.int32)])
        self.seg_gen = np.concatenate([self.seg_gen, np.zeros(extra, np.int64)])

    def _compact(self, rows: int, op: str) -> None:
        """Free segments by appending the live copies of the emptiest ones elsewhere, one
        segment at a time: each needs room for its copies first; the emptiest are at
        most about half full, so each freed segment pays for the next."""
        seg, live = self.seg, self.seg_live
        order = np.argsort(live, kind="stable")
        candidates = order[(live[order] > 0) & (self.seg_buf[order] < 0)]
        gains = np.cumsum(seg - live[candidates])
        count = int(np.searchsorted(gains, rows + seg - self.free_rows())) + 1
        for victim in candidates[:count]:
            if self.free_rows() < int(live[victim]) + seg:
                break
            free_buffers = int(np.count_nonzero(self.buf_seg < 0))
            if free_buffers < 3:
                self._add_buffers(3 - free_buffers, op)
            rows_there = self._read_segment(int(victim), op)
            self.moved += kernels.move_rows(int(victim) * seg, rows_there, *self.state())
            self.write_out(op)

    def _read_segment(self, segment: int, op: str) -> np.ndarray:
        nbytes = self.seg * self.row_bytes
        try:
            data = os.pread(self.fd, nbytes, segment * nbytes)
        except OSError as exc:
            raise self.file.error(op, f"reading segment {segment}", exc) from exc
        if len(data) != nbytes:
            raise self.file.error(op, f"reading segment {segment}", OSError(0, "short read"))
        return np.frombuffer(data, np.float32).reshape(self.seg, self.width)

    # -- writes -----------------------------------------------------------------------
    def write_out(self, op: str, *, everything: bool = False) -> None:
        """Write the full buffers to the file (``everything``: the front's part too, and
        close the front so that the next append starts a new segment).

        Raises:
            ResourceError: naming the table, the file, the op; the rows stay buffered.
        """
        seg = self.seg
        for b in np.flatnonzero(self.buf_seg >= 0):
            segment = int(self.buf_seg[b])
            is_front = b == self.front[2] and self.front[0] < self.front[1]
            if is_front and not everything:
                continue
            rows = int(self.front[0]) - segment * seg if is_front else seg
            self.seg_gen[segment] += 1  # before the write: a concurrent read sees it moved
            self._pwrite(self.bufs[b, :rows], segment * seg * self.row_bytes, op, segment)
            self.buf_seg[b] = -1
            self.seg_buf[segment] = -1
            if is_front:
                self.front[1] = self.front[0]

    def _pwrite(self, rows: np.ndarray, offset: int, op: str, segment: int) -> None:
        view = rows.data.cast("B")  # a C-contiguous slice of a buffer
        try:
            while view.nbytes:
                done = os.pwrite(self.fd, view, offset)
                view, offset = view[done:], offset + done
        except OSError as exc:
            raise self.file.error(
                op, f"writing segment {segment}", exc,
                tail="the rows stay in memory and the write is retried by the next op",
            ) from exc  # fmt: skip

    def sync(self, op: str) -> None:
        """Every buffer in the file: afterwards :attr:`array` shows every disk copy."""
        self.write_out(op, everything=True)

    @property
    def array(self) -> np.ndarray:
        """The file as a ``[rows, width]`` map, for whole-table passes after :meth:`sync`
        (call :meth:`drop_pages` after: its pages count in RSS while mapped)."""
        return self.file.array

    def drop_pages(self) -> None:
        self.file.drop_pages()

    def read_error(self, op: str, row: int) -> ResourceError:
        """The error of a failed ``pread`` of file row ``row`` (re-read for its errno)."""
        try:
            data = os.pread(self.fd, self.row_bytes, row * self.row_bytes)
            exc = OSError(0, f"short read ({len(data)} of {self.row_bytes} bytes)")
        except OSError as error:
            exc = error
        return self.file.error(op, f"reading row {row}", exc)

    def close(self) -> None:
        self.file.close()
