"""Table memory on 2 MB-aligned mappings (table/growth.py; issue 59): a row matrix or an
index's slots from ``HUGE_MIN_BYTES`` on is a mapping of its own at a 2 MB boundary,
advised MADV_HUGEPAGE, and stays so as it grows (its pages move, contents kept); smaller
blocks stay the C allocator's; a failed growth leaves the matrix as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sparseps.table.growth import (
    HUGE_MIN_BYTES,
    HUGE_PAGE,
    Allocator,
    GrowableMatrix,
    is_huge_mapping,
)
from sparseps.testing.faults import FailingAllocator

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/smaps").exists(),
    reason="the aligned mappings are Linux's (elsewhere the C allocator's blocks serve)",
)

WIDTH = 20  # a dim-8 Adagrad row: 80 bytes


def _flags(address: int) -> set[str]:
    """VmFlags of the mapping holding ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            low, high = (int(x, 16) for x in head[0].split("-"))
            inside = low <= address < high
        elif inside and head[0] == "VmFlags:":
            return set(head[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def _fill(matrix: GrowableMatrix) -> None:
    matrix.array[:] = np.arange(matrix.array.size, dtype=np.float32).reshape(matrix.array.shape)


def test_small_block_grows_into_an_aligned_mapping_with_its_contents() -> None:
    matrix = GrowableMatrix(1000, WIDTH, np.float32)
    assert not is_huge_mapping(matrix.array.ctypes.data)  # 80 kB: the C allocator's
    _fill(matrix)
    kept = matrix.array.copy()
    matrix.grow_to(HUGE_MIN_BYTES // (WIDTH * 4) + 1)
    address = matrix.array.ctypes.data
    assert is_huge_mapping(address) and address % HUGE_PAGE == 0
    assert "hg" in _flags(address)
    np.testing.assert_array_equal(matrix.array[:1000], kept)


def test_mapping_grows_aligned_and_keeps_its_rows() -> None:
    matrix = GrowableMatrix(HUGE_MIN_BYTES // (WIDTH * 4) + 5, WIDTH, np.float32)
    _fill(matrix)
    kept = matrix.array.copy()
    for _ in range(3):
        matrix.grow_to(matrix.capacity + 1)
        address = matrix.array.ctypes.data
        assert is_huge_mapping(address) and address % HUGE_PAGE == 0
        assert "hg" in _flags(address)
        np.testing.assert_array_equal(matrix.array[: kept.shape[0]], kept)
    matrix.array[-1] = 7.0  # the grown tail is writable memory
    old = matrix.array.ctypes.data
    del matrix
    assert not is_huge_mapping(old)  # unmapped with the last array over it


def test_index_slots_on_an_aligned_mapping() -> None:
    slots = Allocator().empty(HUGE_MIN_BYTES // 8, np.uint64)
    address = slots.ctypes.data
    assert is_huge_mapping(address) and address % HUGE_PAGE == 0
    slots[:] = 5
    assert int(slots.sum()) == 5 * slots.size
    small = Allocator().empty(1000, np.uint64)
    assert not is_huge_mapping(small.ctypes.data)


def test_failed_growth_of_a_mapping_changes_nothing() -> None:
    allocator = FailingAllocator()
    matrix = GrowableMatrix(HUGE_MIN_BYTES // (WIDTH * 4) + 5, WIDTH, np.float32, allocator)
    _fill(matrix)
    kept, address = matrix.array.copy(), matrix.array.ctypes.data
    allocator.armed = True
    with pytest.raises(MemoryError):
        matrix.grow_to(2 * matrix.capacity)
    assert matrix.array.ctypes.data == address and is_huge_mapping(address)
    np.testing.assert_array_equal(matrix.array, kept)
