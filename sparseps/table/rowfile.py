"""``RowFile``: the file of a table's disk tier: a growable float32 row matrix on disk.

The tier (:mod:`sparseps.table.tier_disk`) decides which file row holds which table row.
The hot path reads rows with ``pread`` and writes whole segments with ``pwrite`` on
:attr:`RowFile.fd` (nothing mapped, so nothing counted in RSS); whole-table passes use
the memory map :attr:`RowFile.array` and drop its pages after. Measured on this box
(issue 14): 8192 random rows read through a memory map in ~1.3 ms, against ~15.6 ms
through LMDB and ~37 ms through rocksdict (their per-key calls, serialisation and locking
dominate); ``pread`` of 3000 random cached rows ~2.6 ms, without mapping anything.

Why the file cannot fail half-way: a write into a memory map has no error return; on a
full disk the kernel answers a page fault in a sparse hole with SIGBUS, which kills the
process (and a ``pwrite`` into a hole can fail with ENOSPC mid-op). So every byte of the file is *allocated* when the file grows
(``posix_fallocate``, which fails with ENOSPC/EFBIG cleanly), before any row is written
there; writes into allocated blocks need no new space. A failed growth raises
:class:`~sparseps.errors.ResourceError` naming the table, the file and the op, with the
file (and the table) unchanged.

Resident memory: pages of a shared file mapping count in the process's RSS while they
are mapped, though the kernel can reclaim them (clean) or write them back (dirty) at any
time. :meth:`RowFile.drop_pages` unmaps them from the process (``MADV_DONTNEED``; the data
stays in the page cache and the file) so that RSS reflects the table's memory budget.

The file is a cache of the server's state, never a durable copy (checkpoints are): it is
created fresh, deleted by :meth:`RowFile.close` (or when the object is collected), and a
server deletes leftovers of a crashed predecessor (:mod:`sparseps.server.disk_dir`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import weakref

import numpy as np

from ..core.closing import Closing
from ..errors import ConfigError, ResourceError
from .growth import planned_rows

__all__ = ["RowFile"]

_serial = itertools.count()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class RowFile(Closing):
    """A growable ``[capacity, width]`` float32 matrix backed by a file under ``folder``.

    Args:
        folder: an existing, writable folder (the server's disk dir).
        table: the table name (file names and error messages).
        width: float32 values per row.
        rows: the initial capacity (rows).

    Raises:
        ConfigError: the folder does not exist or the file cannot be created in it.
    """

    def __init__(self, folder: str, table: str, width: int, rows: int) -> None:
        self.table = table
        self.width = int(width)
        self.row_bytes = 4 * self.width
        if not os.path.isdir(folder):
            raise ConfigError(
                f"table {table!r}: disk dir {folder!r} does not exist (set the server's "
                "--disk-dir / SPARSEPS_DISK_DIR to an existing folder)"
            )
        self.path = os.path.join(folder, f"{table}.{os.getpid()}.{next(_serial)}.rows")
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"table {table!r}: cannot create the row file {self.path}: {exc.strerror}"
            ) from None
        self._finalizer = weakref.finalize(self, _close_fd_and_unlink, self._fd, self.path)
        self._map: mmap.mmap | None = None
        self.array = np.empty((0, self.width), np.float32)
        self.grow_to(rows, op="create", exact=True)

    @property
    def fd(self) -> int:
        """The open file (for ``pread``/``pwrite``)."""
        return self._fd

    @property
    def capacity(self) -> int:
        return int(self.array.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the file (all allocated)."""
        return self.capacity * self.row_bytes

    def bytes_to_hold(self, needed: int, *, exact: bool = False) -> int:
        """Bytes :meth:`grow_to` would add to the file to hold ``needed`` rows."""
        if needed <= self.capacity:
            return 0
        rows = needed if exact else planned_rows(self.capacity, needed, self.row_bytes)
        return (rows - self.capacity) * self.row_bytes

    def grow_to(self, needed: int, *, op: str, exact: bool = False) -> None:
        """Hold at least ``needed`` rows; new rows read as zeros.

        Raises:
            ResourceError: the disk is full (or another I/O error); the file is unchanged.
        """
        old = self.capacity
        if needed <= old:
            return
        rows = needed if exact else planned_rows(old, needed, self.row_bytes)
        old_bytes, new_bytes = old * self.row_bytes, rows * self.row_bytes
        try:
            # allocate every block now: a later write through the map cannot hit ENOSPC
            os.posix_fallocate(self._fd, old_bytes, new_bytes - old_bytes)
            mapping = mmap.mmap(self._fd, new_bytes, mmap.MAP_SHARED)
        except OSError as exc:
            self._truncate_back(old_bytes)
            raise self.error(op, f"growing it to {rows} rows ({new_bytes} bytes)", exc) from exc
        # the old map stays valid for arrays still viewing it and is unmapped when the last
        # one goes; rows written through it are in the file, so the new map sees them
        self._map = mapping
        self.array = np.frombuffer(mapping, np.float32).reshape(rows, self.width)

    def _truncate_back(self, size: int) -> None:
        try:
            if os.fstat(self._fd).st_size > size:
                os.ftruncate(self._fd, size)
        except OSError:  # pragma: no cover - the growth error is the one to report
            pass

    def error(
        self, op: str, what: str, exc: OSError, *, tail: str = "nothing was changed"
    ) -> ResourceError:
        """The error of a failed disk operation, naming the table, the file and the op."""
        reason = exc.strerror or str(exc)
        hint = (
            "; free disk space or give the server a larger --disk-dir"
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
            else ""
        )
        return ResourceError(
            f"{op} on table {self.table!r}: disk tier file {self.path}: {what} failed: "
            f"{reason} (errno {exc.errno}); {tail}{hint}"
        )

    def drop_pages(self) -> None:
        """Unmap the file's pages from this process (RSS); the data stays in the file."""
        if self._map is not None:
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Delete the file (the arrays viewing it must not be used afterwards)."""
        self._map = None
        self.array = np.empty((0, self.width), np.float32)
        self._finalizer()


def _close_fd_and_unlink(fd: int, path: str) -> None:
    try:
        os.close(fd)
    finally:
        _unlink(path)
