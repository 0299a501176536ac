"""The bulk copy of a load: checkpoint columns into new rows, checked in the same pass.

A load of a shard file writes every row once. Done as numpy steps (``isfinite`` per
column, a sort to find repeated keys, a lookup, an insert, then the scatter) it read the
file's 765 MB about six times for 5M rows; here one compiled pass copies each row from
the columns (read-only views of the memory-mapped file) into its storage row and checks
it on the way (NaN/inf, negative ``unseen_days``). Repeated and present keys are found by
the insert itself (:meth:`~sparseps.table.hashmap.KeyIndex.insert_absent`).

The rows are written before the keys are inserted, at ids no key owns yet
(:meth:`~sparseps.table.hashmap.KeyIndex.planned_ids`: freed ids or ids past the high
water), so a check that fails here leaves the table as it was.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

from ..core.jit import njit

__all__ = ["BAD_UNSEEN", "NOT_FINITE", "advise_huge_pages", "copy_new_rows"]

NOT_FINITE, BAD_UNSEEN = 1, 2  # what copy_new_rows found wrong
_MADV_HUGEPAGE = 14  # Linux
_HUGE = 2 << 20


def _madvise():
    if not sys.platform.startswith("linux"):  # pragma: no cover - the hint is Linux's
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - no C library by that name
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return function


_MADVISE = _madvise()


def advise_huge_pages(rows: np.ndarray) -> None:
    """Ask for transparent huge pages under ``rows`` (a C-contiguous block not written yet).

    A load writes hundreds of MB of fresh rows: with 4 KB pages their first-touch faults
    took 3/4 of the copy (0.33 of 0.44 s for 5M rows here), with 2 MB pages 1/512 as
    many. numpy asks the same for its own large arrays (so ``np.fromfile``, the bench's
    baseline, gets them); the C allocator the table's rows come from does not. Only a
    hint: where the kernel has THP off, or the call fails, nothing changes.
    """
    if _MADVISE is None or rows.nbytes < 2 * _HUGE:
        return
    address = rows.ctypes.data
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + rows.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start:
        _MADVISE(start, end - start, _MADV_HUGEPAGE)


@njit(nogil=True, cache=True)
def _copy_rows(storage, ids, select, emb, state, show, click, delta, unseen, touched, stat0):
    # pragma: no cover - compiled
    dim = emb.shape[1]
    sdim = state.shape[1]
    has_select = select.shape[0] > 0
    has_touched = touched.shape[0] > 0
    for k in range(ids.shape[0]):
        src = select[k] if has_select else k
        r = ids[k]
        # v - v is 0 for finite v and NaN for inf/NaN: one or-reduction per row
        bad = False
        for j in range(dim):
            v = emb[src, j]
            storage[r, j] = v
            bad |= (v - v) != 0
        for j in range(sdim):
            v = state[src, j]
            storage[r, dim + j] = v
            bad |= (v - v) != 0
        a, b, c = show[src], click[src], delta[src]
        storage[r, stat0] = a
        storage[r, stat0 + 1] = b
        storage[r, stat0 + 2] = c
        bad |= (a - a) != 0 or (b - b) != 0 or (c - c) != 0
        if bad:
            return NOT_FINITE, k
        u = unseen[src]
        if u < 0:
            return BAD_UNSEEN, k
        # -1: pushed since the last decay (the row layout's touched mark)
        storage[r, stat0 + 3] = -1.0 if has_touched and touched[src] != 0 else np.float32(u)
    return 0, -1


def copy_new_rows(
    storage: np.ndarray,
    ids: np.ndarray,
    cols: dict[str, np.ndarray],
    where: dict[str, int],
    select: np.ndarray | None = None,
) -> tuple[int, int]:
    """``storage[ids[k]]`` = row ``select[k]`` (or ``k``) of shape-checked row columns.

    Args:
        storage: the table's rows, grown to hold every id.
        ids: int64 [m] storage rows to write.
        cols: row columns (``check_columns(..., values=False)``); arrays may be read-only.
        where: the table's first storage column of each field.
        select: int64 [m] rows of ``cols`` to copy, None for all (then m = len(cols)).

    Returns:
        ``(0, -1)``, or ``(NOT_FINITE or BAD_UNSEEN, k)`` for the first bad row ``k`` (a
        position in ``ids``); rows after it are not written.
    """
    stat0 = where["show"]
    assert (where["click"], where["delta_score"], where["unseen"]) == (
        stat0 + 1, stat0 + 2, stat0 + 3,
    ), "the row layout's statistics columns are show, click, delta_score, unseen"  # fmt: skip
    touched = cols.get("touched")
    problem, at = _copy_rows(
        storage, ids, np.empty(0, np.int64) if select is None else select,
        cols["embedding"], cols["state"], cols["show"], cols["click"], cols["delta_score"],
        cols["unseen_days"], np.empty(0, np.uint8) if touched is None else touched, stat0,
    )  # fmt: skip
    return int(problem), int(at)
