"""``SparseTable``: one shard of a sparse embedding table (DESIGN §2.5).

The table holds its parts, one concept each, over one storage:

- :class:`~sparseps.table.storage.TableStorage`: the key index, the rows (one float32
  matrix laid out by :class:`~sparseps.table.layout.RowLayout`, or with
  ``config.memory_rows`` a :class:`~sparseps.table.tier.RowTier`: a cache of the hot rows
  over a row file, where every op promotes the rows it touches and runs the same kernels
  on the cache, so results are identical) and the pending keys' counters;
- :class:`~sparseps.table.push.PushTransaction`: ``push`` and ``push_delta``;
- :class:`~sparseps.table.restore.RowTransfer`: rows out and in as columns (saves,
  loads, moves of shards);
- :class:`~sparseps.table.full_rows.FullRows`: whole rows for GPUPS;
- :class:`~sparseps.table.lifecycle_ops.LifecycleOps`: decay, shrink, drop.

Pulls (the hot read) are this module's own; the other public methods hand the call to
their part.

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

from collections.abc import Iterable, Iterator
from typing import Self

import numpy as np

from ..config import TableConfig
from ..core.closing import Closing
from ..errors import ConfigError, InputError
from . import input_checks as checks
from .batch import gather
from .embedx_push import EmbedxPush
from .full_rows import FullRows
from .growth import Allocator
from .initializers import fill_initial
from .lifecycle_ops import LifecycleOps
from .push import PushHooks, PushTransaction
from .restore import RowTransfer
from .split_rows import pull_cvm, pull_split
from .stats import TableStats
from .storage import TableStorage
from .tier import PrefetchPlan

__all__ = ["SparseTable", "TableStats"]


class SparseTable(Closing):
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
        self._storage = TableStorage(config, allocator=allocator, disk_dir=disk_dir)
        # the columns the table exchanges (a split table's base rows have their own)
        self.layout = self._storage.export_layout
        self._updates = PushTransaction(
            self._storage, hooks, EmbedxPush(self._storage) if self._storage.split else None
        )
        self._columns = RowTransfer(self._storage)
        self._full_rows = FullRows(self._storage)
        self._lifecycle = LifecycleOps(self._storage)

    # -- size -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._storage.index)

    @property
    def nbytes(self) -> int:
        """Bytes of memory (a tiered table's disk file is not counted)."""
        return self._storage.nbytes

    def stats(self) -> TableStats:
        store = self._storage
        rows, tier = len(store.index), store.tier
        in_memory = rows if tier is None else tier.cached_rows
        return TableStats(
            name=self.config.name,
            rows=rows,
            pending=len(store.pending_index),
            capacity=int(store.rows.shape[0] if tier is None else tier.capacity),
            bytes_used=int(store.nbytes),
            dim=self.config.dim,
            embedx_rows=rows if store.embedx is None else store.embedx.live,
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
        tier = self._storage.tier
        return None if tier is None else tier.path

    def close(self) -> None:
        """Delete a tiered table's disk file (the table must not be used afterwards)."""
        self._storage.close()

    def reserve(self, rows: int) -> None:
        """Pre-size storage for ``rows`` live rows (e.g. before loading a checkpoint)."""
        self._storage.grow("reserve", rows - len(self._storage.index), 0, exact=True)

    def keys(self) -> np.ndarray:
        """uint64 keys of the live rows (slot order)."""
        return self._storage.index.items()[0]

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """bool ``[n]``: whether each key is a live row."""
        return self._storage.index.contains(checks.check_key_array("contains", keys))

    # -- pull / push ------------------------------------------------------------------
    def pull(self, keys: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        """Embeddings of ``keys`` (uint64 ``[n]``, any order, repeats allowed).

        Args:
            out: where to write them (a C-contiguous, writable float32
                ``[n, pull_dim]``: a server writes a same-host client's reply slot);
                default a fresh array.

        Returns:
            ``out``, or a fresh float32 ``[n, config.pull_dim]`` array (``dim``; with
            ``accessor.cvm`` each key's show and click first). Rows not admitted yet are
            zeros, except with admission "always", where a never-seen key gets its
            initial value. A split table's row without an embedx part reads zeros there
            (:mod:`~sparseps.table.split_rows`).

        Raises:
            InputError: ``keys`` is not a C-contiguous 1-D uint64 array, or ``out`` is
                not what it must be.
        """
        store = self._storage
        width = self.config.pull_dim
        keys = checks.check_key_array("pull", keys)
        if out is not None:
            checks.check_matrix("pull", "out", out, len(keys), width)
            if not out.flags.writeable:
                raise InputError("pull: out must be writable")
        ids = store.index.find(keys)
        tier = store.tier
        if store.split or self.config.accessor.cvm:
            if out is None:
                out = np.empty((len(keys), width), np.float32)
            return self._pull_whole(keys, ids, out)
        dim = store.dim
        if tier is None:
            out, missing = gather(store.rows, ids, dim, out)
        else:
            with tier.lock:  # a pull promotes rows: pulls of one table take turns here
                slots = tier.gather_slots(ids, "pull")  # first: it may grow (move) the cache
                out, missing = gather(tier.cache, slots, dim, out)
        if missing and store.always:
            where = np.flatnonzero(ids < 0)
            fill_initial(out, where, keys[where], dim, self.config.initializer, self.config.seed)
        return out

    def _pull_whole(self, keys: np.ndarray, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """A pull of a split table, or with cvm (table/split_rows.py)."""
        store = self._storage
        tier, embedx = store.tier, store.embedx
        if embedx is None:
            if tier is None:
                pull_cvm(store, keys, store.rows, ids, out)
            else:
                with tier.lock:
                    pull_cvm(store, keys, tier.cache, tier.gather_slots(ids, "pull"), out)
            return out
        xs = embedx.xids_of(ids)
        if tier is None:
            pull_split(store, keys, store.rows, ids, embedx.rows, xs, out)
            return out
        with tier.lock, embedx.tier.lock:  # type: ignore[union-attr]
            slots = tier.gather_slots(ids, "pull")
            xslots = embedx.tier.gather_slots(xs, "pull")  # type: ignore[union-attr]
            pull_split(store, keys, tier.cache, slots, embedx.tier.cache, xslots, out)  # type: ignore[union-attr]
        return out

    def plan_prefetch(self, keys: np.ndarray) -> PrefetchPlan | None:
        """The first step of :meth:`prefetch`: which of ``keys``' rows to read ahead (None
        for an in-memory table or when every row is in memory). A server holds the
        table's read lock for this step and for :meth:`install_prefetch`, and none while
        ``plan.read()`` runs."""
        tier = self._storage.tier
        if tier is None:
            return None
        keys = checks.check_key_array("prefetch", keys, contiguous=False)
        return tier.plan_prefetch(self._storage.index.find(np.ascontiguousarray(keys)))

    def install_prefetch(self, plan: PrefetchPlan) -> int:
        """The last step of :meth:`prefetch`: cache the rows ``plan`` read that are still
        current; returns how many."""
        tier = self._storage.tier
        assert tier is not None, "plan_prefetch gives no plan for an in-memory table"
        return tier.install_prefetch(plan)

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
        self._updates.apply("push", keys, grads, "grads", shows, clicks, delta=False)

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
        self._updates.apply("push_delta", keys, deltas, "deltas", shows, clicks, delta=True)

    # -- whole rows (GPUPS; table/full_rows.py) ------------------------------------------
    @property
    def full_width(self) -> int:
        """Columns of a full row: ``dim + state_dim``."""
        return self._full_rows.full_width

    def pull_full(self, keys: np.ndarray) -> np.ndarray:
        """Embedding and optimizer state of ``keys``: :meth:`FullRows.pull_full
        <sparseps.table.full_rows.FullRows.pull_full>`."""
        return self._full_rows.pull_full(keys)

    def pull_counts(self, keys: np.ndarray) -> np.ndarray:
        """Is each key a row, and a pending key's counters: :meth:`FullRows.pull_counts
        <sparseps.table.full_rows.FullRows.pull_counts>`."""
        return self._full_rows.pull_counts(keys)

    def write_rows(
        self,
        keys: np.ndarray,
        rows: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> None:
        """Upsert whole rows: :meth:`FullRows.write_rows
        <sparseps.table.full_rows.FullRows.write_rows>`."""
        self._full_rows.write_rows(keys, rows, shows, clicks)

    # -- lifecycle (table/lifecycle_ops.py) --------------------------------------------
    def decay(self, rate: float | None = None) -> None:
        """End of a day: :meth:`LifecycleOps.decay <sparseps.table.lifecycle_ops.LifecycleOps.decay>`."""
        self._lifecycle.decay(rate)

    def drop(self, keys: np.ndarray) -> int:
        """Delete keys' rows and pending counters: :meth:`LifecycleOps.drop
        <sparseps.table.lifecycle_ops.LifecycleOps.drop>`."""
        return self._lifecycle.drop(keys)

    def shrink(self) -> np.ndarray:
        """Delete low-score and long-unseen rows: :meth:`LifecycleOps.shrink
        <sparseps.table.lifecycle_ops.LifecycleOps.shrink>`."""
        return self._lifecycle.shrink()

    def reset_delta_score(self) -> None:
        """Zero every row's delta_score (after a delta save)."""
        self._lifecycle.reset_delta_score()

    # -- rows as columns (table/restore.py) --------------------------------------------
    def export_rows(self) -> dict[str, np.ndarray]:
        """Every live row as columns: :meth:`RowTransfer.export_rows
        <sparseps.table.restore.RowTransfer.export_rows>`."""
        return self._columns.export_rows()

    def export_row_parts(self, rows_per_part: int) -> Iterator[dict[str, np.ndarray]]:
        """:meth:`export_rows` in parts: :meth:`RowTransfer.export_row_parts
        <sparseps.table.restore.RowTransfer.export_row_parts>`."""
        return self._columns.export_row_parts(rows_per_part)

    def export_keys(self, keys: np.ndarray) -> tuple[dict, dict]:
        """The row and pending columns of ``keys`` only: :meth:`RowTransfer.export_keys
        <sparseps.table.restore.RowTransfer.export_keys>`."""
        return self._columns.export_keys(keys)

    def export_pending(self) -> dict[str, np.ndarray]:
        """Admission counters of keys not admitted yet: :meth:`RowTransfer.export_pending
        <sparseps.table.restore.RowTransfer.export_pending>`."""
        return self._columns.export_pending()

    def import_rows(
        self,
        columns: dict,
        *,
        strict: bool = False,
        select: np.ndarray | None = None,
        parallel: bool = True,
    ) -> None:
        """Upsert rows from :meth:`export_rows` columns: :meth:`RowTransfer.import_rows
        <sparseps.table.restore.RowTransfer.import_rows>`."""
        self._columns.import_rows(columns, strict=strict, select=select, parallel=parallel)

    def import_pending(self, columns: dict, *, strict: bool = False) -> None:
        """Upsert pending counters from :meth:`export_pending` columns:
        :meth:`RowTransfer.import_pending <sparseps.table.restore.RowTransfer.import_pending>`."""
        self._columns.import_pending(columns, strict=strict)

    # -- restore -----------------------------------------------------------------------
    def empty_like(self) -> Self:
        """A new, empty table with this one's config and allocator (to restore into)."""
        store = self._storage
        return type(self)(self.config, allocator=store.allocator, disk_dir=store.disk_dir)

    def adopt(self, other: Self) -> None:
        """Take ``other``'s contents (rows, state, counters, pending keys) in one step.

        ``other`` must come from :meth:`empty_like` (same layout); it is emptied. The
        caller holds the table's write lock.
        """
        if other is self:
            return
        if other.layout != self.layout:
            raise InputError(
                f"adopt into table {self.config.name!r}: layouts differ ({other.layout} vs "
                f"{self.layout})"
            )
        self._storage.take(other._storage)

    def restore(self, rows: Iterable[dict], pending: Iterable[dict] = ()) -> None:
        """Make the table exactly the union of ``rows`` and ``pending`` column sets.

        Every part is validated and imported into a fresh table first; the table changes
        only if all of them succeed (then atomically, by :meth:`adopt`).

        Raises:
            InputError: a bad part, or parts that overlap; the table is unchanged.
            ResourceError: out of memory; the table is unchanged.
        """
        fresh = self.empty_like()
        for columns in rows:
            fresh.import_rows(columns, strict=True)
        for columns in pending:
            fresh.import_pending(columns, strict=True)
        self.adopt(fresh)
