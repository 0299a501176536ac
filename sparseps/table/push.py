"""The push as a transaction: new rows aside, existing rows in place with a backup.

A push runs in three phases and changes the table only if all of them succeed:

1. **stage** (no table state changes): decide admission of missing keys on a scratch
   copy of their pending counters; build the rows the push creates in a scratch matrix
   (initial value and state, statistics, the rule's update) and check them;
2. **apply in place, backed up**: copy the touched existing rows aside (one gather),
   then apply statistics and the rule's fused update to them where they are, check
   every value of every touched row (embedding, optimizer state, counters) for NaN/inf,
   and reserve memory for the new keys. If *anything* in this phase raises (a
   non-finite result -> InputError, out of memory -> ResourceError, or any other error,
   e.g. one injected through :class:`PushHooks`) the backup is scattered back and the
   table is byte-for-byte what it was;
3. **commit** (allocates nothing, so it cannot fail half-way): insert the new keys,
   scatter the staged new rows, write the pending counters back.

Rules are total over finite input (:mod:`sparseps.optim.numerics`), so a push of finite
gradients does not fail in phase 2; the check and the restore are the last line of
defence (geo mode's ``push_delta`` has no rule and can overflow: it is rejected that way).

Cost against updating in place with no safety: one gather of the touched rows into a
reused scratch matrix plus one compiled finiteness pass over them (both on rows the
update brings into cache anyway); the restore costs a scatter only when a push fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.jit import njit
from ..errors import InputError
from ..optim.prefetch import PREFETCH_AHEAD, prefetch_row
from .lifecycle import admit

__all__ = [
    "PendingStage",
    "PushHooks",
    "check_rows",
    "check_staged",
    "gather_rows",
    "scatter_rows",
    "stage_pending",
]


class PushHooks:
    """Test hooks of a table's updates: an explicit object handed to the table (never a
    patched global). Subclass and override; the defaults do nothing.

    ``SparseTable(config, hooks=...)`` and ``DenseTable(..., hooks=...)`` call
    :meth:`mid_apply` in the middle of applying an update to the table's own memory; an
    exception raised there is a failure half-way through the apply, which the table must
    survive unchanged.
    """

    def mid_apply(self, op: str, table: str, done: int, total: int) -> None:
        """Called after the update of ``done`` of the push's ``total`` touched existing
        rows was written in place (sparse), or after the step was computed and before it
        is committed (dense, ``done == total == 1``)."""


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


@njit(nogil=True, cache=True)
def _rows_nonfinite(storage, ids):  # pragma: no cover - compiled
    # the exponent-bit OR-reduction of _any_nonfinite, over the rows ``ids`` of a matrix
    bits = storage.view(np.uint32)
    width = bits.shape[1]
    flags = np.uint32(0)
    for i in range(ids.shape[0]):
        r = ids[i]
        for j in range(width):
            flags |= (bits[r, j] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
    return (flags & np.uint32(0x80000000)) != 0


def check_rows(op: str, table: str, storage: np.ndarray, ids: np.ndarray, keys: np.ndarray,
               what: str = "row") -> None:  # fmt: skip
    """:func:`check_staged` for the rows ``ids`` of ``storage`` (checked where they are).

    Raises:
        InputError: naming the table, how many rows, and the first key.
    """
    if ids.shape[0] and _rows_nonfinite(storage, ids):
        rows = np.empty((ids.shape[0], storage.shape[1]), storage.dtype)
        gather_rows(storage, ids, rows)
        check_staged(op, table, rows, keys, what)


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
