"""The push as a transaction: compute the new rows aside, check them, allocate, commit.

A push used to update rows in place, inserting keys into the index before storage grew
and applying the rule before anything was checked. Now it runs in three phases:

1. **stage** (no table state changes): gather the touched rows into a scratch matrix
   (new rows get their initial value and state there), decide admission on a scratch
   copy of the pending counters, then apply statistics and the rule's fused update to
   the scratch rows;
2. **check**: every value of every staged row (embedding, optimizer state, counters)
   must be finite, else the whole push is rejected (:func:`check_staged`);
3. **allocate, then commit**: grow the indexes and matrices for exactly the new keys
   (a ``MemoryError`` here leaves everything unchanged), then insert keys and scatter
   the scratch rows back; nothing in the commit allocates, so it cannot fail half-way.

Cost: one gather and one scatter of the touched rows (the rule runs on contiguous
scratch rows instead of scattered ones) plus a compiled finiteness pass over them; no
per-key Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..errors import InputError
from ..optim.prefetch import PREFETCH_AHEAD, prefetch_row
from .lifecycle import admit

__all__ = ["PendingStage", "check_staged", "gather_rows", "scatter_rows", "stage_pending"]


@njit(nogil=True, cache=True)
def gather_rows(storage, ids, out):  # pragma: no cover - compiled
    """``out[i] = storage[ids[i]]`` (all columns); zeros where ``ids[i] < 0``."""
    n = ids.shape[0]
    width = out.shape[1]
    for i in range(n):
        if i + PREFETCH_AHEAD < n and ids[i + PREFETCH_AHEAD] >= 0:
            prefetch_row(storage, ids[i + PREFETCH_AHEAD], 0, width)
        r = ids[i]
        if r >= 0:
            for j in range(width):
                out[i, j] = storage[r, j]
        else:
            for j in range(width):
                out[i, j] = 0.0


@njit(nogil=True, cache=True)
def scatter_rows(storage, ids, rows):  # pragma: no cover - compiled
    """``storage[ids[i]] = rows[i]`` (all columns)."""
    n = ids.shape[0]
    width = rows.shape[1]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, ids[i + PREFETCH_AHEAD], 0, width)
        r = ids[i]
        for j in range(width):
            storage[r, j] = rows[i, j]


@njit(nogil=True, cache=True)
def _nonfinite_rows(rows):  # pragma: no cover - compiled
    count = 0
    first = -1
    for i in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            if not np.isfinite(rows[i, j]):
                count += 1
                if first < 0:
                    first = i
                break
    return count, first


@njit(nogil=True, cache=True)
def _any_nonfinite(bits):  # pragma: no cover - compiled
    # NaN/inf <=> all exponent bits set <=> (bits & 0x7F800000) + 0x00800000 has bit 31:
    # an integer OR-reduction, which LLVM vectorises (a float test per element does not)
    flags = np.uint32(0)
    for i in range(bits.shape[0]):
        flags |= (bits[i] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
    return (flags & np.uint32(0x80000000)) != 0


def check_staged(op: str, table: str, rows: np.ndarray, keys: np.ndarray, what: str) -> None:
    """Reject a push whose staged ``rows`` (one per ``keys``) hold a NaN or inf anywhere.

    Raises:
        InputError: naming the table, how many rows, and the first key.
    """
    if not _any_nonfinite(rows.reshape(-1).view(np.uint32)):
        return
    count, first = _nonfinite_rows(rows)
    if count:
        raise InputError(
            f"{op} to table {table!r}: the update would make {count} {what}(s) non-finite "
            f"(first key {int(keys[first])}): rejected, the table is unchanged; lower the "
            "learning rate or the gradients, or bound the weights with the rule's clip"
        )


@dataclass
class PendingStage:
    """Admission of a push's missing keys, decided on a scratch copy of their counters.

    Attributes:
        keys: the missing (not a row) keys of the push, unique.
        pids: their pending ids, -1 for keys not pending yet.
        counters: float32 ``[k, 3]`` their counters after this push (show, click, unseen).
        admitted: bool ``[k]`` keys that become rows now.
        prior_show, prior_click: float32 ``[k]`` the counters before this push.
    """

    keys: np.ndarray
    pids: np.ndarray
    counters: np.ndarray
    admitted: np.ndarray
    prior_show: np.ndarray
    prior_click: np.ndarray

    @property
    def inserts(self) -> np.ndarray:
        """Positions of keys that stay pending and are not pending yet (to insert)."""
        return np.flatnonzero(~self.admitted & (self.pids < 0))

    @property
    def updates(self) -> np.ndarray:
        """Positions of keys that stay pending and already are (counters written back)."""
        return np.flatnonzero(~self.admitted & (self.pids >= 0))

    @property
    def erases(self) -> np.ndarray:
        """Positions of pending keys admitted now (their pending entry goes)."""
        return np.flatnonzero(self.admitted & (self.pids >= 0))


def stage_pending(index, storage, keys, shows, clicks, policy, seed) -> PendingStage:
    """Decide admission for ``keys`` (unique, not rows) without changing ``index``/``storage``."""
    pids = index.find(keys)
    counters = np.empty((keys.shape[0], storage.shape[1]), np.float32)
    gather_rows(storage, pids, counters)
    local = np.arange(keys.shape[0], dtype=np.int64)
    admitted, prior_show, prior_click = admit(
        counters, local, pids < 0, keys, shows, clicks, policy, seed
    )
    return PendingStage(keys, pids, counters, admitted, prior_show, prior_click)
