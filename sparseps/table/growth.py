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

Huge pages (Linux): a block of :data:`HUGE_MIN_BYTES` or more is its own anonymous
mapping, 2 MB-aligned, sized in whole 2 MB pages and advised ``MADV_HUGEPAGE``, so the
kernel can back all of it with transparent huge pages (a server's batch reads rows
scattered over the whole matrix: with 4 KB pages nearly every row is a TLB miss). glibc's
``realloc`` grows such blocks with ``mremap`` to wherever it likes, and the kernel splits
huge pages that land misaligned; here a growth maps a new aligned region and moves the old
pages to its start with ``mremap(MREMAP_FIXED)`` (page tables move, 2 MB at a time; no
bytes are copied). Where the C library lacks ``mmap``/``mremap``/``malloc_usable_size``
the blocks stay glibc's (the previous behaviour); where the kernel refuses the advice the
block works with small pages.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

__all__ = [
    "DEFAULT_ALLOCATOR", "DOUBLING_BYTES", "HUGE_MIN_BYTES", "HUGE_PAGE", "Allocator",
    "GrowableMatrix", "is_huge_mapping", "planned_rows",
]  # fmt: skip

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

HUGE_PAGE = 2 << 20
HUGE_MIN_BYTES = 4 << 20  # blocks from this size on: an aligned mapping of their own
_PROT_RW, _MAP_ANON_PRIVATE = 0x3, 0x22  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
_MREMAP_MAYMOVE, _MREMAP_FIXED, _MADV_HUGEPAGE = 1, 2, 14
_MAP_FAILED = ctypes.c_void_p(-1).value


def _load_mm():
    """libc's mmap, munmap, mremap, madvise and malloc_usable_size, or None (not Linux)."""
    if _LIBC is None or not sys.platform.startswith("linux"):
        return None
    try:
        mm = {name: getattr(_LIBC, name)
              for name in ("mmap", "munmap", "mremap", "madvise", "malloc_usable_size")}  # fmt: skip
    except AttributeError:  # pragma: no cover - a C library without them
        return None
    void, size = ctypes.c_void_p, ctypes.c_size_t
    mm["mmap"].restype = void
    mm["mmap"].argtypes = [void, size, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    mm["munmap"].argtypes = [void, size]
    mm["mremap"].restype = void
    mm["mremap"].argtypes = [void, size, size, ctypes.c_int, void]
    mm["madvise"].argtypes = [void, size, ctypes.c_int]
    mm["malloc_usable_size"].restype = size
    mm["malloc_usable_size"].argtypes = [void]
    return mm


_MM = _load_mm()
# address -> mapped bytes of the blocks that are aligned mappings (module-level: every
# Allocator, subclasses included, frees what any of them mapped)
_MAPPED: dict[int, int] = {}


def _pages(nbytes: int) -> int:
    return -(-nbytes // HUGE_PAGE) * HUGE_PAGE


def _map_aligned(nbytes: int) -> int:
    """A fresh anonymous mapping of ``nbytes`` (whole 2 MB pages) at a 2 MB boundary,
    advised MADV_HUGEPAGE (refused advice is ignored: small pages still work)."""
    assert _MM is not None
    raw = _MM["mmap"](None, nbytes + HUGE_PAGE, _PROT_RW, _MAP_ANON_PRIVATE, -1, 0)
    if raw is None or raw == _MAP_FAILED:
        raise MemoryError(f"mmap of {nbytes} bytes failed")
    start = -(-raw // HUGE_PAGE) * HUGE_PAGE
    if start > raw:
        _MM["munmap"](raw, start - raw)
    tail = raw + nbytes + HUGE_PAGE - (start + nbytes)
    if tail:
        _MM["munmap"](start + nbytes, tail)
    _MM["madvise"](start, nbytes, _MADV_HUGEPAGE)
    return start


class Allocator:
    """Where tables get memory: the single hook for out-of-memory tests.

    ``malloc``/``realloc`` return an address (int) or raise ``MemoryError``; ``empty`` makes
    the numpy arrays of the key index. A subclass may raise ``MemoryError`` from any of them
    to simulate exhaustion; the table must then be left unchanged.
    """

    def malloc(self, nbytes: int) -> int:
        if _MM is not None and nbytes >= HUGE_MIN_BYTES:
            size = _pages(nbytes)
            address = _map_aligned(size)
            _MAPPED[address] = size
            return address
        address = _LIBC.malloc(max(nbytes, 1))
        if not address:
            raise MemoryError(f"malloc of {nbytes} bytes failed")
        return address

    def realloc(self, address: int, nbytes: int) -> int:
        mapped = _MAPPED.get(address)
        if mapped is not None:
            return _remap(address, mapped, nbytes)
        if _MM is not None and nbytes >= HUGE_MIN_BYTES:  # a small block becomes a mapping
            new = self.malloc(nbytes)
            ctypes.memmove(new, address, min(_MM["malloc_usable_size"](address), nbytes))
            _LIBC.free(address)
            return new
        moved = _LIBC.realloc(address, max(nbytes, 1))
        if not moved:
            raise MemoryError(f"realloc to {nbytes} bytes failed")
        return moved

    def free(self, address: int) -> None:
        mapped = _MAPPED.pop(address, None)
        if mapped is None:
            _LIBC.free(address)
        else:
            assert _MM is not None
            _MM["munmap"](address, mapped)

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialised array (a key index's slots): from :data:`HUGE_MIN_BYTES` on,
        on an aligned mapping of its own (module docstring), unmapped with the array."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if _MM is None or nbytes < HUGE_MIN_BYTES:
            return np.empty(shape, dtype)
        size = _pages(nbytes)
        address = _map_aligned(size)
        _MAPPED[address] = size
        block = _Block(self, address)
        buffer = (ctypes.c_byte * nbytes).from_address(address)
        buffer.block = block  # the array keeps its mapping alive
        return np.frombuffer(buffer, dtype).reshape(shape)


def _remap(address: int, mapped: int, nbytes: int) -> int:
    """Grow (or keep) the aligned mapping at ``address`` to hold ``nbytes``: its pages
    move to the start of a new aligned mapping; on failure the old one is unchanged."""
    assert _MM is not None
    size = _pages(nbytes)
    if size <= mapped:
        return address
    new = _map_aligned(size)
    moved = _MM["mremap"](address, mapped, mapped, _MREMAP_MAYMOVE | _MREMAP_FIXED, new)
    if moved is None or moved == _MAP_FAILED:
        _MM["munmap"](new, size)
        raise MemoryError(f"mremap of {mapped} to {size} bytes failed")
    del _MAPPED[address]
    _MAPPED[new] = size
    return new


def is_huge_mapping(address: int) -> bool:
    """Whether the block at ``address`` is one of this module's aligned mappings."""
    return address in _MAPPED


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
