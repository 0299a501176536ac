"""``SparseTable``: one shard of a sparse embedding table (DESIGN §2.5).

Storage: a :class:`~sparseps.table.hashmap.KeyIndex` maps each live key to a dense row
id; rows live in one float32 matrix laid out by :class:`~sparseps.table.layout.RowLayout`.
Erased ids go to a free stack and are reused first, so the matrix only grows when the
number of live rows does. It doubles while small and then grows by 25%, in place
(:mod:`~sparseps.table.growth`: never old + new at once). Keys that are not admitted yet
live in a second, small index with only their counters (show, click, unseen).

With ``config.memory_rows`` the rows live in a :class:`~sparseps.table.tier.RowTier`
instead: a cache of the hot rows over a row file; every op promotes the rows it touches
and runs the same kernels on the cache (slots for row ids), so results are identical.

Push path (all compiled, one pass each; :mod:`~sparseps.table.push`): merge repeated
keys -> find -> admission of missing keys on scratch counters -> new rows built and
checked in scratch -> back up the touched existing rows -> statistics and the rule's
fused update in place -> finiteness check -> allocate (restore the backup if any of
these raise) -> insert new keys and scatter the new rows.

Semantics pinned here:

- A push validates everything first and is all-or-nothing: a NaN/inf gradient anywhere,
  or an update that would make any value of a row (embedding, state, counters) NaN/inf,
  rejects the whole batch (InputError naming the table, the count and the first key);
  running out of memory raises ResourceError (table, rows, bytes). The table is then
  unchanged; so it is after any other error raised in the middle of the apply (the
  touched rows are restored from their backup). The rules never produce NaN/inf from
  finite input (:mod:`sparseps.optim.numerics`), so a push of finite gradients succeeds.
- On the push that admits a key, the row is created with its initial value, its counters
  start from the pending counters, and *that push's gradient is applied* (so the first
  admitted push is not wasted). Pushes before admission only add to the counters.
- ``pull`` never changes state. For admission "always" a never-seen key returns the
  initial value the first push will create; otherwise missing keys return zeros.
"""

from __future__ import annotations

import numpy as np

from ..config import Admission, TableConfig
from ..core.closing import Closing
from ..errors import ConfigError, InputError, ResourceError
from . import input_checks as checks
from .batch import add_rows, dedup_merge, gather, init_rows, touch_rows
from .full_rows import FullRows
from .growth import Allocator, GrowableMatrix
from .hashmap import KeyIndex
from .initializers import fill_initial
from .layout import STAT_COLUMNS, RowLayout
from .lifecycle_ops import LifecycleOps
from .push import PushHooks, check_rows, check_staged, gather_rows, scatter_rows, stage_pending
from .restore import PENDING_WHERE, TableFiles
from .stats import TableStats
from .tier import PrefetchPlan, tier_for

__all__ = ["SparseTable", "TableStats"]

INITIAL_ROWS = 256
_NO_ROWS = np.empty(0, np.int64)


class SparseTable(TableFiles, FullRows, LifecycleOps, Closing):
    """One shard of a sparse table.

    Not thread-safe for writers: the owner serialises mutating calls (the server holds a
    per-table write lock); concurrent ``pull`` calls are safe and release the GIL in the
    compiled kernels.

    Args:
        config: the table's :class:`~sparseps.config.TableConfig`.
        allocator: the memory hook (:class:`~sparseps.table.growth.Allocator`; tests
            pass one that fails to check out-of-memory behaviour).
        hooks: test hooks (:class:`~sparseps.table.push.PushHooks`) called in the middle
            of a push's in-place apply; None in production.
        disk_dir: the folder of the disk tier's row file; required when
            ``config.memory_rows`` is set (:mod:`~sparseps.table.tier`), else unused.

    Raises:
        ConfigError: ``config.memory_rows`` is set and ``disk_dir`` is not (or does not exist).
    """

    def __init__(
        self,
        config: TableConfig,
        *,
        allocator: Allocator | None = None,
        hooks: PushHooks | None = None,
        disk_dir: str | None = None,
    ) -> None:
        if not isinstance(config, TableConfig):
            raise ConfigError(f"SparseTable: expected a TableConfig, got {type(config).__name__}")
        self.config = config
        self.layout = RowLayout.for_rule(config.dim, config.rule)
        self._dim = config.dim
        self._stat0 = self.layout.column("show")
        # first storage column of each exported field (see RowLayout)
        self._where = {"dim": self._dim, **{n: self.layout.column(n) for n in STAT_COLUMNS}}
        self._policy = config.lifecycle
        self._always = config.lifecycle.admission is Admission.ALWAYS
        self._state0 = np.ascontiguousarray(config.rule.initial_state(config.dim), np.float32)
        self._allocator = allocator
        self._disk_dir = disk_dir
        self._tier = tier_for(config, self.layout.width, disk_dir, allocator)
        self._index = KeyIndex(allocator=allocator)
        # a tiered table keeps its rows in the tier; this matrix stays empty
        initial = INITIAL_ROWS if self._tier is None else 0
        self._store = GrowableMatrix(initial, self.layout.width, np.float32, allocator)
        self._pending_index = KeyIndex(allocator=allocator)
        self._pending_store = GrowableMatrix(16, len(PENDING_WHERE), np.float32, allocator)
        self._hooks = hooks
        # reused scratch rows (see _scratch_rows): the push's backup and its new rows
        self._backup = np.empty((0, self.layout.width), np.float32)
        self._fresh = np.empty((0, self.layout.width), np.float32)

    @property
    def _rows(self) -> np.ndarray:
        # re-read on every use: a growth replaces the array (see growth.py)
        return self._store.array

    @property
    def _pending(self) -> np.ndarray:
        return self._pending_store.array

    # -- size -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        """Bytes of memory (a tiered table's disk file is not counted)."""
        tier = 0 if self._tier is None else self._tier.nbytes
        return (
            self._rows.nbytes
            + tier
            + self._index.nbytes
            + self._pending.nbytes
            + self._pending_index.nbytes
        )

    def stats(self) -> TableStats:
        rows, tier = len(self._index), self._tier
        in_memory = rows if tier is None else tier.cached_rows
        return TableStats(
            name=self.config.name,
            rows=rows,
            pending=len(self._pending_index),
            capacity=int(self._rows.shape[0] if tier is None else tier.capacity),
            bytes_used=int(self.nbytes),
            dim=self._dim,
            memory_rows=in_memory,
            disk_rows=rows - in_memory,
            disk_bytes=0 if tier is None else tier.file_bytes,
            disk_reads=0 if tier is None else int(tier.counts[0]),
            disk_writes=0 if tier is None else int(tier.counts[2]),
            prefetched=0 if tier is None else int(tier.counts[3]),
            prefetch_stale=0 if tier is None else int(tier.counts[4]),
        )

    @property
    def disk_path(self) -> str | None:
        """The disk tier's row file (row id ``r`` = file row ``r``), None if in memory."""
        return None if self._tier is None else self._tier.path

    def close(self) -> None:
        """Delete a tiered table's disk file (the table must not be used afterwards)."""
        if self._tier is not None:
            self._tier.close()

    def reserve(self, rows: int) -> None:
        """Pre-size storage for ``rows`` live rows (e.g. before loading a checkpoint)."""
        self._grow("reserve", rows - len(self._index), 0, exact=True)

    def keys(self) -> np.ndarray:
        """uint64 keys of the live rows (slot order)."""
        return self._index.items()[0]

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """bool ``[n]``: whether each key is a live row."""
        return self._index.contains(checks.check_key_array("contains", keys))

    # -- pull / push ------------------------------------------------------------------
    def pull(self, keys: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        """Embeddings of ``keys`` (uint64 ``[n]``, any order, repeats allowed).

        Args:
            out: where to write them (a C-contiguous, writable float32 ``[n, dim]``: a
                server writes a same-host client's reply slot); default a fresh array.

        Returns:
            ``out``, or a fresh float32 ``[n, dim]`` array. Rows not admitted yet are
            zeros, except with admission "always", where a never-seen key gets its
            initial value.

        Raises:
            InputError: ``keys`` is not a C-contiguous 1-D uint64 array, or ``out`` is
                not what it must be.
        """
        keys = checks.check_key_array("pull", keys)
        if out is not None:
            checks.check_matrix("pull", "out", out, len(keys), self._dim)
            if not out.flags.writeable:
                raise InputError("pull: out must be writable")
        ids = self._index.find(keys)
        tier = self._tier
        if tier is None:
            out, missing = gather(self._rows, ids, self._dim, out)
        else:
            with tier.lock:  # a pull promotes rows: pulls of one table take turns here
                slots = tier.gather_slots(ids, "pull")  # first: it may grow (move) the cache
                out, missing = gather(tier.cache, slots, self._dim, out)
        if missing and self._always:
            where = np.flatnonzero(ids < 0)
            fill_initial(
                out, where, keys[where], self._dim, self.config.initializer, self.config.seed
            )
        return out

    def plan_prefetch(self, keys: np.ndarray) -> PrefetchPlan | None:
        """The first step of :meth:`prefetch`: which of ``keys``' rows to read ahead (None
        for an in-memory table or when every row is in memory). A server holds the
        table's read lock for this step and for :meth:`install_prefetch`, and none while
        ``plan.read()`` runs."""
        if self._tier is None:
            return None
        keys = checks.check_key_array("prefetch", keys, contiguous=False)
        return self._tier.plan_prefetch(self._index.find(np.ascontiguousarray(keys)))

    def install_prefetch(self, plan: PrefetchPlan) -> int:
        """The last step of :meth:`prefetch`: cache the rows ``plan`` read that are still
        current; returns how many."""
        assert self._tier is not None, "plan_prefetch gives no plan for an in-memory table"
        return self._tier.install_prefetch(plan)

    def prefetch(self, keys: np.ndarray) -> int:
        """Promote the rows of ``keys`` that are only on disk into memory, ahead of the
        pull that will ask for them (:mod:`~sparseps.table.tier`); absent keys are
        ignored. Returns the rows promoted (always 0 for an in-memory table). Values and
        results of every op are the same with or without it."""
        plan = self.plan_prefetch(keys)
        if plan is None:
            return 0
        plan.read()
        return self.install_prefetch(plan)

    def push(
        self,
        keys: np.ndarray,
        grads: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> None:
        """Apply one optimizer step to the rows of ``keys``.

        Args:
            keys: uint64 ``[n]``; repeated keys are merged first (gradients, shows and
                clicks summed).
            grads: float32 ``[n, dim]``, C-contiguous, all finite.
            shows: float32 ``[n]`` >= 0, or None for 1 per occurrence.
            clicks: float32 ``[n]`` >= 0, or None for 0.

        Raises:
            InputError: a dtype, shape or contiguity problem, or NaN/inf anywhere in
                ``grads`` (the whole push is rejected; the table is unchanged).
        """
        self._apply("push", keys, grads, "grads", shows, clicks, delta=False)

    def push_delta(
        self,
        keys: np.ndarray,
        deltas: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> None:
        """Geo mode: ``embedding += delta`` per key (merged), no optimizer rule or clip.

        Same arguments, validation, admission and statistics as :meth:`push`.
        """
        self._apply("push_delta", keys, deltas, "deltas", shows, clicks, delta=True)

    def _apply(self, op, keys, values, name, shows, clicks, *, delta: bool) -> None:
        keys = checks.check_key_array(op, keys)
        n = keys.shape[0]
        values = checks.check_matrix(op, name, values, n, self._dim)
        shows = checks.counts_or_default(op, "shows", shows, n, 1.0)
        clicks = checks.counts_or_default(op, "clicks", clicks, n, 0.0)
        checks.check_finite(op, name, values, keys)
        if n == 0:
            return
        uniq, merged, merged_shows, merged_clicks = dedup_merge(keys, values, shows, clicks)
        table = self.config.name
        if uniq.size < n:  # sums of repeated keys' finite values can overflow float32
            check_staged(op, table, merged, uniq, f"merged {name} row")
            merged_counts = np.stack([merged_shows, merged_clicks], axis=1)
            check_staged(op, table, merged_counts, uniq, "merged shows/clicks of a key")
        # -- stage: nothing here changes the table -----------------------------------------
        tier = self._tier
        ids = self._index.find(uniq)
        if tier is not None:  # room in memory for every row this push touches
            tier.begin(uniq.size, op, ids=ids, new_rows=int(np.count_nonzero(ids < 0)))
        missing = np.flatnonzero(ids < 0)
        pending = None
        if missing.size == 0:
            new = _NO_ROWS
        elif self._always:
            new = missing
            prior_show = prior_click = np.zeros(missing.size, np.float32)
        else:  # admission on scratch counters; gradients of keys still pending are dropped
            pending = stage_pending(
                self._pending_index, self._pending, uniq[missing], merged_shows[missing],
                merged_clicks[missing], self._policy, self.config.seed,
            )  # fmt: skip
            check_staged(op, table, pending.counters, pending.keys, "pending key")
            new = missing[pending.admitted]
            prior_show = pending.prior_show[pending.admitted]
            prior_click = pending.prior_click[pending.admitted]
        fresh = None
        if new.size:  # the rows this push creates, built and checked aside
            fresh = self._scratch_rows("_fresh", new.size)
            local = np.arange(new.size, dtype=np.int64)
            config, policy = self.config, self._policy
            fill_initial(fresh, local, uniq[new], self._dim, config.initializer, config.seed)
            init_rows(fresh, local, self._state0, prior_show, prior_click, self._dim,
                      self._stat0, policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
            touch_rows(fresh, local, merged_shows[new], merged_clicks[new], self._stat0,
                       policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
            self._update(fresh, local, np.ascontiguousarray(merged[new]), delta)
            check_staged(op, table, fresh, uniq[new], "row")
        if missing.size:
            old = np.flatnonzero(ids >= 0)
            old_ids, old_keys = ids[old], uniq[old]
            merged = np.ascontiguousarray(merged[old])
            merged_shows, merged_clicks = merged_shows[old], merged_clicks[old]
        else:
            old_ids, old_keys = ids, uniq
        # -- apply to the existing rows in place, restoring them if anything fails ---------
        # (tiered: to their cached copies, promoted here; the same kernels on slots)
        if tier is not None:
            old_ids = tier.slots(old_ids, op, dirty=True)
        rows = self._rows if tier is None else tier.cache
        backup = self._scratch_rows("_backup", old_ids.size)
        gather_rows(rows, old_ids, backup)
        try:
            touch_rows(rows, old_ids, merged_shows, merged_clicks, self._stat0,
                       self._policy.nonclick_coeff, self._policy.click_coeff)  # fmt: skip
            if not self._update(rows, old_ids, merged, delta, op=op):
                check_rows(op, table, rows, old_ids, old_keys)  # names the rows; raises
            self._grow(op, new.size, 0 if pending is None else pending.inserts.size,
                       pending_erases=0 if pending is None else pending.erases.size)  # fmt: skip
        except BaseException:
            # re-read: a growth may have moved the matrix (the cache does not grow here)
            scatter_rows(self._rows if tier is None else tier.cache, old_ids, backup)
            raise
        # -- commit: allocates nothing --------------------------------------------------
        if fresh is not None:
            new_ids, _ = self._index.find_or_insert(uniq[new])
            if tier is None:
                scatter_rows(self._rows, new_ids, fresh)
            else:  # begin() made room: placing them evicts only rows this push did not touch
                slots = tier.slots(new_ids, op, load=False, dirty=True)
                scatter_rows(tier.cache, slots, fresh)
        if pending is not None:
            self._commit_pending(pending)

    def _update(self, storage, rows, grads, delta: bool, *, op: str = "") -> bool:
        """The rule's update (or geo's add) of ``storage[rows]``; with test hooks, in two
        halves with :meth:`PushHooks.mid_apply` between them.

        Returns True only if the kernel vouched that every value it wrote is finite (the
        built-in ones check in registers, which is cheaper than a pass over the rows);
        otherwise the caller checks the rows.
        """
        step = add_rows if delta else self.config.rule.update
        if self._hooks is None or not op:
            return step(storage, rows, grads, self._dim) is True
        half = rows.shape[0] // 2
        first = step(storage, rows[:half], grads[:half], self._dim)
        self._hooks.mid_apply(op, self.config.name, half, rows.shape[0])
        second = step(storage, rows[half:], grads[half:], self._dim)
        return first is True and second is True

    def _scratch_rows(self, which: str, rows: int) -> np.ndarray:
        """A scratch ``[rows, width]`` matrix, reused across pushes (a fresh multi-MB
        array per push costs page faults comparable to the update itself)."""
        scratch = getattr(self, which)
        if scratch.shape[0] < rows:
            scratch = np.empty((max(rows, 2 * scratch.shape[0]), self.layout.width), np.float32)
            setattr(self, which, scratch)
        return scratch[:rows]

    def _commit_pending(self, stage) -> None:
        """Write a staged admission back (space was reserved: nothing here allocates)."""
        updates, inserts = stage.updates, stage.inserts
        scatter_rows(self._pending, stage.pids[updates], stage.counters[updates])
        if inserts.size:
            pids, _ = self._pending_index.find_or_insert(stage.keys[inserts])
            scatter_rows(self._pending, pids, stage.counters[inserts])
        erases = stage.erases
        if erases.size:
            self._pending_index.erase(stage.keys[erases])

    def _grow(self, op: str, rows: int, pending: int, *, pending_erases: int = 0,
              exact: bool = False) -> None:  # fmt: skip
        """Make room for ``rows`` new rows and ``pending`` new pending keys, or raise
        ResourceError with the table unchanged (an index may have been rehashed larger)."""
        index = self._index
        store = self._store if self._tier is None else self._tier
        needed = index.high_water + max(0, rows - index.free_ids)
        p_index, p_store = self._pending_index, self._pending_store
        p_needed = p_index.high_water + max(0, pending - p_index.free_ids)
        try:
            index.reserve(max(rows, 0))
            if self._tier is None:
                self._store.grow_to(needed, exact=exact)
            else:  # the per-id maps (disk space was reserved by the op's begin)
                self._tier.grow_to(needed, op, exact=exact)
            p_index.reserve(pending, erasing=pending_erases)
            p_store.grow_to(p_needed)
        except ResourceError:
            raise
        except MemoryError as exc:
            wanted = (
                index.bytes_to_reserve(max(rows, 0)) + store.bytes_to_hold(needed, exact=exact)
                + p_index.bytes_to_reserve(pending) + p_store.bytes_to_hold(p_needed)
            )  # fmt: skip
            raise ResourceError(
                f"{op} to table {self.config.name!r}: out of memory making room for {rows} new "
                f"row(s) and {pending} new pending key(s): needed {wanted} more bytes on top of "
                f"the table's {self.nbytes}; the push was rejected and the table is unchanged "
                f"({exc})"
            ) from exc
