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
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..core.jit import njit
from ..errors import InputError
from ..optim.prefetch import PREFETCH_AHEAD, prefetch_row
from . import input_checks as checks
from .batch import GATHER_AHEAD, add_rows, dedup_merge, init_rows, touch_row, touch_rows
from .initializers import fill_initial
from .lifecycle import admit

if TYPE_CHECKING:
    from .storage import TableStorage

__all__ = [
    "EmbedxHalf",
    "PendingStage",
    "PushHooks",
    "PushTransaction",
    "check_rows",
    "check_staged",
    "gather_rows",
    "scatter_rows",
    "stage_pending",
]


class EmbedxHalf(Protocol):
    """The embedx half of a split table's push (:mod:`~sparseps.table.embedx_push`): run
    in the transaction's phases (after the base rows' counters, before the growth; undone
    on failure; committed after the new keys are in)."""

    def apply(self, op, base, old_slots, old_ids, old_keys, old_grads, fresh, new_keys,
              new_grads, *, delta: bool) -> int: ...  # fmt: skip

    def rollback(self) -> None: ...

    def commit(self, op: str, old_ids: np.ndarray, new_ids: np.ndarray) -> None: ...


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


# rows a push backs up, counts and steps together (PushTransaction._apply_old): 512 rows
# of 80 bytes stay in a core's L2 between the compiled pass and the rule's step
CHUNK_ROWS = 512


@njit(nogil=True, cache=True)
def backup_touch(storage, ids, start, stop, backup, shows, clicks, stat0, nonclick,
                 click_coeff):  # fmt: skip  # pragma: no cover - compiled
    """For ``i`` in ``[start, stop)``: ``backup[i] = storage[ids[i]]``, then add the push's
    shows/clicks to the row's counters as :func:`~sparseps.table.batch.touch_rows` does
    (same float64 sums, same saturation: bit-identical). Prefetches ``GATHER_AHEAD`` rows
    ahead, past ``stop`` too, so the next chunk's misses are under way."""
    n = ids.shape[0]
    width = storage.shape[1]
    for i in range(start, stop):
        if i + GATHER_AHEAD < n:
            prefetch_row(storage, ids[i + GATHER_AHEAD], 0, width)
        r = ids[i]
        for j in range(width):
            backup[i, j] = storage[r, j]
        s = np.float64(shows[i])
        c = np.float64(clicks[i])
        touch_row(storage, r, s, c, stat0, nonclick, click_coeff)


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


def check_staged(op: str, table: str, rows: np.ndarray, keys: np.ndarray, what: str) -> None:
    """Reject a push whose staged ``rows`` (one per ``keys``) hold a NaN or inf anywhere.

    Raises:
        InputError: naming the table, how many rows, and the first key.
    """
    if not checks.any_nonfinite(rows.reshape(-1).view(np.uint32)):
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
    # the exponent-bit OR-reduction of input_checks.any_nonfinite, over the rows ``ids`` of a matrix
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


_NO_ROWS = np.empty(0, np.int64)


class PushTransaction:
    """A table's ``push`` and ``push_delta``: the three phases of the module docstring,
    on the table's storage.

    Args:
        storage: the table's storage.
        hooks: test hooks called in the middle of the in-place apply; None in production.
    """

    def __init__(self, storage: TableStorage, hooks: PushHooks | None,
                 embedx: EmbedxHalf | None = None) -> None:  # fmt: skip
        self.storage = storage
        self.hooks = hooks
        self.embedx = embedx  # a split table's embedx half (table/embedx_push.py)
        # reused scratch rows (see _scratch_rows): the push's backup and its new rows
        width = storage.layout.width
        self._backed_up = 0  # see _apply_old
        self._scratch = {"backup": np.empty((0, width), np.float32),
                         "fresh": np.empty((0, width), np.float32)}  # fmt: skip

    def apply(self, op, keys, values, name, shows, clicks, *, delta: bool) -> None:
        """Validate, then update the rows of ``keys`` by ``values`` (the rule's step, or
        geo's add with ``delta``), all or nothing; ``name`` names ``values`` in errors.

        A split table's ``values`` are ``[n, config.dim]``: the base rows take the first
        ``embed_dim`` columns, the embedx half (:attr:`embedx`) the others."""
        store = self.storage
        dim, config = store.dim, store.config
        keys = checks.check_key_array(op, keys)
        n = keys.shape[0]
        values = checks.check_matrix(op, name, values, n, config.dim)
        shows = checks.counts_or_default(op, "shows", shows, n, 1.0)
        clicks = checks.counts_or_default(op, "clicks", clicks, n, 0.0)
        checks.check_finite(op, name, values, keys)
        if n == 0:
            return
        uniq, merged, merged_shows, merged_clicks = dedup_merge(keys, values, shows, clicks)
        table = config.name
        if uniq.size < n:  # sums of repeated keys' finite values can overflow float32
            check_staged(op, table, merged, uniq, f"merged {name} row")
            merged_counts = np.stack([merged_shows, merged_clicks], axis=1)
            check_staged(op, table, merged_counts, uniq, "merged shows/clicks of a key")
        xgrads = None
        if self.embedx is not None:  # the embed columns go to the base rows
            xgrads = merged[:, dim:]
            merged = np.ascontiguousarray(merged[:, :dim])
        # -- stage: nothing here changes the table -----------------------------------------
        tier, policy = store.tier, store.policy
        ids = store.index.find(uniq)
        if tier is not None:  # room in memory for every row this push touches
            tier.begin(uniq.size, op, ids=ids, new_rows=int(np.count_nonzero(ids < 0)))
        missing = np.flatnonzero(ids < 0)
        pending = None
        if missing.size == 0:
            new = _NO_ROWS
        elif store.always:
            new = missing
            prior_show = prior_click = np.zeros(missing.size, np.float32)
        else:  # admission on scratch counters; gradients of keys still pending are dropped
            pending = stage_pending(
                store.pending_index, store.pending, uniq[missing], merged_shows[missing],
                merged_clicks[missing], policy, config.seed,
            )  # fmt: skip
            check_staged(op, table, pending.counters, pending.keys, "pending key")
            new = missing[pending.admitted]
            prior_show = pending.prior_show[pending.admitted]
            prior_click = pending.prior_click[pending.admitted]
        fresh = None
        if new.size:  # the rows this push creates, built and checked aside
            fresh = self._scratch_rows("fresh", new.size)
            local = np.arange(new.size, dtype=np.int64)
            fill_initial(fresh, local, uniq[new], dim, store.initializer, config.seed)
            init_rows(fresh, local, store.state0, prior_show, prior_click, dim,
                      store.stat0, policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
            touch_rows(fresh, local, merged_shows[new], merged_clicks[new], store.stat0,
                       policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
            self._update(fresh, local, np.ascontiguousarray(merged[new]), delta)
            check_staged(op, table, fresh, uniq[new], "row")
        old = np.flatnonzero(ids >= 0) if missing.size else None
        if old is not None:
            old_ids, old_keys = ids[old], uniq[old]
            merged = np.ascontiguousarray(merged[old])
            merged_shows, merged_clicks = merged_shows[old], merged_clicks[old]
        else:
            old_ids, old_keys = ids, uniq
        base_ids = old_ids
        # -- apply to the existing rows in place, restoring them if anything fails ---------
        # (tiered: to their cached copies, promoted here; the same kernels on slots)
        if tier is not None:
            old_ids = tier.slots(old_ids, op, dirty=True)
        rows = store.rows if tier is None else tier.cache
        backup = self._scratch_rows("backup", old_ids.size)
        self._backed_up = 0  # rows of old_ids backed up so far (_apply_old's chunks)
        try:
            if not self._apply_old(rows, old_ids, backup, merged, merged_shows, merged_clicks,
                                   delta, op):  # fmt: skip
                check_rows(op, table, rows, old_ids, old_keys)  # names the rows; raises
            created = 0
            if self.embedx is not None:
                assert xgrads is not None
                empty = np.empty((0, store.layout.width), np.float32)
                created = self.embedx.apply(
                    op, rows, old_ids, base_ids, old_keys,
                    xgrads if old is None else xgrads[old],
                    empty if fresh is None else fresh, uniq[new], xgrads[new], delta=delta,
                )  # fmt: skip
            store.grow(op, new.size, 0 if pending is None else pending.inserts.size,
                       pending_erases=0 if pending is None else pending.erases.size,
                       embedx_rows=created)  # fmt: skip
        except BaseException:
            # re-read: a growth may have moved the matrix (the cache does not grow here)
            done = self._backed_up  # the rows after it were neither backed up nor changed
            scatter_rows(store.rows if tier is None else tier.cache, old_ids[:done],
                         backup[:done])  # fmt: skip
            if self.embedx is not None:
                self.embedx.rollback()
            raise
        # -- commit: allocates nothing --------------------------------------------------
        new_ids = _NO_ROWS
        if fresh is not None:
            new_ids, _ = store.index.find_or_insert(uniq[new])
            if tier is None:
                scatter_rows(store.rows, new_ids, fresh)
            else:  # begin() made room: placing them evicts only rows this push did not touch
                slots = tier.slots(new_ids, op, load=False, dirty=True)
                scatter_rows(tier.cache, slots, fresh)
        if self.embedx is not None:
            self.embedx.commit(op, base_ids, new_ids)
        if pending is not None:
            self._commit_pending(pending)

    def _apply_old(self, matrix, rows, backup, grads, shows, clicks, delta: bool, op: str) -> bool:
        """Back up, count and step the existing ``matrix[rows]`` in chunks of
        :data:`CHUNK_ROWS`: a chunk's backup copy and counters are one compiled pass (the
        rows' cache misses, prefetched ahead across chunks), and the rule's step follows
        on the same rows while they are still in cache (three passes over the whole batch
        before: each row missed once and was read from L3 twice more).

        The backup of every row is taken before its update, so a failure in any chunk
        restores the whole batch (the rows backed up so far, :attr:`_backed_up`: the later
        chunks' rows were not touched). With test hooks: one chunk (their mid-apply call sits
        between two halves of the rule's step, as before). Returns :meth:`_update`'s
        verdict over all chunks.
        """
        store, policy = self.storage, self.storage.policy
        n = rows.shape[0]
        chunk = n if self.hooks is not None else CHUNK_ROWS
        finite = True
        for start in range(0, n, max(chunk, 1)):
            stop = min(n, start + chunk)
            backup_touch(matrix, rows, start, stop, backup, shows, clicks, store.stat0,
                         policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
            self._backed_up = stop
            finite &= self._update(matrix, rows[start:stop], grads[start:stop], delta, op=op)
        return finite

    def _update(self, matrix, rows, grads, delta: bool, *, op: str = "") -> bool:
        """The rule's update (or geo's add) of ``matrix[rows]``; with test hooks, in two
        halves with :meth:`PushHooks.mid_apply` between them.

        Returns True only if the kernel vouched that every value it wrote is finite (the
        built-in ones check in registers, which is cheaper than a pass over the rows);
        otherwise the caller checks the rows.
        """
        dim, config = self.storage.dim, self.storage.config
        step = add_rows if delta else self.storage.rule.update
        if self.hooks is None or not op:
            return step(matrix, rows, grads, dim) is True
        half = rows.shape[0] // 2
        first = step(matrix, rows[:half], grads[:half], dim)
        self.hooks.mid_apply(op, config.name, half, rows.shape[0])
        second = step(matrix, rows[half:], grads[half:], dim)
        return first is True and second is True

    def _scratch_rows(self, which: str, rows: int) -> np.ndarray:
        """A scratch ``[rows, width]`` matrix, reused across pushes (a fresh multi-MB
        array per push costs page faults comparable to the update itself)."""
        scratch = self._scratch[which]
        if scratch.shape[0] < rows:
            width = self.storage.layout.width
            scratch = np.empty((max(rows, 2 * scratch.shape[0]), width), np.float32)
            self._scratch[which] = scratch
        return scratch[:rows]

    def _commit_pending(self, stage: PendingStage) -> None:
        """Write a staged admission back (space was reserved: nothing here allocates)."""
        store = self.storage
        updates, inserts = stage.updates, stage.inserts
        scatter_rows(store.pending, stage.pids[updates], stage.counters[updates])
        if inserts.size:
            pids, _ = store.pending_index.find_or_insert(stage.keys[inserts])
            scatter_rows(store.pending, pids, stage.counters[inserts])
        erases = stage.erases
        if erases.size:
            store.pending_index.erase(stage.keys[erases])
