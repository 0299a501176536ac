"""Memory of the tables: one allocator hook and row matrices that grow in place.

A table's row matrix grows by doubling while small and by 25% above
:data:`DOUBLING_BYTES`. Growing by copying into a new matrix needs old + new memory at
once (2.25x the matrix at a 25% step), exactly when memory is scarcest. Here the matrix
lives in memory from the C allocator and grows with ``realloc``: for blocks above glibc's
mmap threshold (at most 32 MB) that is ``mremap``, which moves page mappings instead of
bytes, so a growth needs only the *new* size (and the added pages cost nothing until
rows are written into them). Small matrices may be copied by ``realloc``; they are small.
``numpy.ndarray.resize`` was measured to copy (old + new resident), hence ``ctypes``.

The price: the old array object is invalid after a growth (its memory may be gone). Only
the owner may hold it, under its write lock (the server's per-table lock; readers never
run during a push), and every method re-reads :attr:`GrowableMatrix.array`.

All-or-nothing: :meth:`GrowableMatrix.grow_to` either returns with the capacity it was
asked for or raises ``MemoryError`` with the matrix unchanged (``realloc`` keeps the old
block when it fails). Tests pass an :class:`Allocator` subclass that fails on purpose.
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["DEFAULT_ALLOCATOR", "DOUBLING_BYTES", "Allocator", "GrowableMatrix", "planned_rows"]

DOUBLING_BYTES = 64 << 20  # below this a matrix doubles; above it grows by 25%


def _load_libc():
    try:
        libc = ctypes.CDLL(None)
        functions = libc.malloc, libc.realloc, libc.free
    except (OSError, AttributeError):  # pragma: no cover - no C library by that name
        return None
    functions[0].restype = ctypes.c_void_p
    functions[0].argtypes = [ctypes.c_size_t]
    functions[1].restype = ctypes.c_void_p
    functions[1].argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    functions[2].restype = None
    functions[2].argtypes = [ctypes.c_void_p]
    return libc


_LIBC = _load_libc()


class Allocator:
    """Where tables get memory: the single hook for out-of-memory tests.

    ``malloc``/``realloc`` return an address (int) or raise ``MemoryError``; ``empty`` makes
    the numpy arrays of the key index. A subclass may raise ``MemoryError`` from any of them
    to simulate exhaustion; the table must then be left unchanged.
    """

    def malloc(self, nbytes: int) -> int:
        address = _LIBC.malloc(max(nbytes, 1))
        if not address:
            raise MemoryError(f"malloc of {nbytes} bytes failed")
        return address

    def realloc(self, address: int, nbytes: int) -> int:
        moved = _LIBC.realloc(address, max(nbytes, 1))
        if not moved:
            raise MemoryError(f"realloc to {nbytes} bytes failed")
        return moved

    def free(self, address: int) -> None:
        _LIBC.free(address)

    def empty(self, shape, dtype) -> np.ndarray:
        return np.empty(shape, dtype)


DEFAULT_ALLOCATOR = Allocator()


def planned_rows(capacity: int, needed: int, row_bytes: int, *, divisor: int = 4,
                 doubling_bytes: int = DOUBLING_BYTES) -> int:  # fmt: skip
    """The capacity after growing a ``capacity``-row matrix to hold ``needed`` rows: double
    below ``doubling_bytes``, else grow by ``1 / divisor``."""
    if needed <= capacity:
        return capacity
    step = capacity if capacity * row_bytes < doubling_bytes else capacity // divisor
    return max(needed, capacity + max(step, 1))


class _Block:
    """One malloc'd block; freed when its matrix and the last array viewing it are gone."""

    def __init__(self, allocator: Allocator, address: int) -> None:
        self.allocator = allocator
        self.address = address

    def __del__(self) -> None:
        if self.address:
            self.allocator.free(self.address)
            self.address = 0


class GrowableMatrix:
    """A C-contiguous 2-D array whose row count grows in place (see module doc).

    Args:
        rows: initial capacity (rows).
        width: columns.
        dtype: numpy dtype of the elements.
        allocator: the memory hook (default: the C allocator).
        divisor, doubling_bytes: the growth step (:func:`planned_rows`): a split table's
            small rows grow by 1/8 (their slack is a larger share of a feature's bytes;
            a step costs a ``realloc``, which moves page tables, not bytes).
    """

    def __init__(self, rows: int, width: int, dtype, allocator: Allocator | None = None, *,
                 divisor: int = 4, doubling_bytes: int = DOUBLING_BYTES) -> None:  # fmt: skip
        self.allocator = DEFAULT_ALLOCATOR if allocator is None else allocator
        self.divisor, self.doubling_bytes = divisor, doubling_bytes
        self.width = int(width)
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.width * self.dtype.itemsize
        if _LIBC is None:  # pragma: no cover - no C allocator: plain numpy, copying growth
            self._block = None
            self.array = np.empty((rows, self.width), self.dtype)
            return
        self._block = _Block(self.allocator, self.allocator.malloc(rows * self.row_bytes))
        self.array = self._view(rows)

    def _view(self, rows: int) -> np.ndarray:
        nbytes = rows * self.row_bytes
        if nbytes == 0:
            return np.empty((rows, self.width), self.dtype)
        assert self._block is not None  # rows > 0 always have a block
        buffer = (ctypes.c_byte * nbytes).from_address(self._block.address)
        buffer.block = self._block  # an array keeps its block alive (never a dangling free)
        return np.frombuffer(buffer, self.dtype).reshape(rows, self.width)

    @property
    def capacity(self) -> int:
        return int(self.array.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def _planned(self, needed: int, exact: bool) -> int:
        if needed <= self.capacity:
            return self.capacity
        if exact:
            return needed
        return planned_rows(self.capacity, needed, self.row_bytes, divisor=self.divisor,
                            doubling_bytes=self.doubling_bytes)  # fmt: skip

    def bytes_to_hold(self, needed: int, *, exact: bool = False) -> int:
        """Bytes :meth:`grow_to` would add to hold ``needed`` rows (0 if it holds them)."""
        return (self._planned(needed, exact) - self.capacity) * self.row_bytes

    def grow_to(self, needed: int, *, exact: bool = False) -> None:
        """Hold at least ``needed`` rows (contents kept); unchanged on ``MemoryError``.

        Args:
            needed: rows the matrix must hold.
            exact: grow to exactly ``needed`` (a known final size) instead of by a step.
        """
        capacity = self.capacity
        if needed <= capacity:
            return
        rows = self._planned(needed, exact)
        if self._block is None:  # pragma: no cover - see __init__
            grown = np.empty((rows, self.width), self.dtype)
            grown[:capacity] = self.array
            self.array = grown
            return
        self._block.address = self.allocator.realloc(self._block.address, rows * self.row_bytes)
        self.array = self._view(rows)
