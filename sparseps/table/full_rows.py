"""Whole rows in and out: embedding and optimizer state together (GPUPS' pull and write).

A pull gives embeddings only, and a push changes rows only through the rule; a worker
that trains rows elsewhere (GPUPS trains a pass's rows on its device with the same rule,
:mod:`sparseps.worker.gpups`) needs both halves of a row: it reads each row's embedding
*and* optimizer state before the pass and writes both back after it.

- :meth:`FullRows.pull_full`: float32 ``[n, dim + state_dim]``, the stored embedding then
  the state columns (the row layout's first ``dim + state_dim`` columns,
  :class:`~sparseps.table.layout.RowLayout`). A key that is not a row reads as a pull
  reads it (admission "always": its initial embedding, else zeros) with the rule's
  initial state: what the first push would start from. Changes nothing.
- :meth:`FullRows.write_rows`: upsert. Each key's embedding and state *become* the given
  values (an overwrite, not an addition: the writer must own the keys, as a GPUPS owner
  does); its counters change as :meth:`~sparseps.table.SparseTable.push_delta` changes
  them (show/click added, delta_score raised by the score, marked pushed since the last
  decay). A key that is not a row becomes one (no admission: the writer decided),
  starting from its pending counters if it had any. Validated first, all-or-nothing.

Worked example (dim 2, Adagrad: one accumulator per element)::

    pull_full([7])                    -> [[e0, e1, 0, 0]]    (initial e, initial state)
    write_rows([7], [[.5, .6, 2, 3]], shows=[4], clicks=[1])
    pull_full([7])                    -> [[.5, .6, 2, 3]]    show 4, click 1
"""

from __future__ import annotations

import numpy as np

from ..core.keysets import has_repeats
from ..errors import InputError
from . import input_checks as checks
from .batch import gather, init_rows, touch_rows
from .columns import gather_columns
from .initializers import fill_initial
from .push import check_staged, gather_rows, scatter_rows
from .split_transfer import embedx_mask, import_split, widen
from .storage import TableStorage

__all__ = ["FullRows"]


class FullRows:
    """``pull_full`` / ``write_rows`` of a :class:`~sparseps.table.SparseTable`, on its storage."""

    def __init__(self, storage: TableStorage) -> None:
        self.storage = storage
        layout = storage.export_layout  # a split table's whole rows: both parts
        self.full_width = layout.dim + layout.state_dim

    def pull_full(self, keys: np.ndarray) -> np.ndarray:
        """Embedding and optimizer state of ``keys`` (uint64 ``[n]``, repeats allowed).

        Returns:
            A fresh float32 ``[n, dim + state_dim]`` array (see the module docstring for
            keys that are not rows).

        Raises:
            InputError: ``keys`` is not a C-contiguous 1-D uint64 array.
        """
        store = self.storage
        keys = checks.check_key_array("pull_full", keys)
        ids = store.index.find(keys)
        tier, width = store.tier, self.full_width
        if store.split:
            return self._pull_split(keys, ids)
        if tier is None:
            out, missing = gather(store.rows, ids, width)
        else:
            with tier.lock:  # promotes rows, as a pull does
                slots = tier.gather_slots(ids, "pull_full")
                out, missing = gather(tier.cache, slots, width)
        if missing:
            where = np.flatnonzero(ids < 0)
            if store.always:
                config = store.config
                fill_initial(out, where, keys[where], store.dim, config.initializer, config.seed)
            out[where, store.dim :] = store.state0
        return out

    def pull_counts(self, keys: np.ndarray) -> np.ndarray:
        """float32 ``[n, 3]``: per key 1 when it is a row (else 0), and the show and click
        counters of a key still pending admission (0 otherwise). GPUPS trains a pass's
        keys under admission on its device from these (:mod:`sparseps.worker.gpups_admit`).
        Changes nothing."""
        store = self.storage
        keys = checks.check_key_array("pull_counts", keys)
        out = np.zeros((keys.shape[0], 3), np.float32)
        out[:, 0] = store.index.find(keys) >= 0
        pids = store.pending_index.find(keys)
        pending = np.flatnonzero(pids >= 0)
        out[pending, 1:] = store.pending[pids[pending], :2]
        return out

    def _pull_split(self, keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """:meth:`pull_full` of a split table: ``[embedding (dim) | embed state | embedx
        state]``; a row without an embedx part reads zeros and the initial state there."""
        store = self.storage
        config = store.config
        dim, edim = config.dim, store.dim
        out = np.zeros((keys.shape[0], self.full_width), np.float32)
        esd = store.layout.state_dim
        out[:, dim : dim + esd] = store.state0
        out[:, dim + esd :] = store.embedx.state0  # type: ignore[union-attr]
        found = np.flatnonzero(ids >= 0)
        if found.size:
            fids = ids[found]
            tier = store.tier
            if tier is None:
                base = gather_columns(store.rows, keys[found], fids, store.where)
            else:
                rows = np.empty((found.size, store.layout.width), np.float32)
                with tier.lock:
                    slots = tier.gather_slots(fids, "pull_full")  # first: it may move the cache
                    gather_rows(tier.cache, slots, rows)
                base = gather_columns(rows, keys[found], np.arange(found.size), store.where)
            whole = widen(store, base, fids, "pull_full")
            out[found, :dim] = whole["embedding"]
            out[found, dim:] = whole["state"]
        if found.size < keys.shape[0] and store.always:
            where = np.flatnonzero(ids < 0)
            fill_initial(out, where, keys[where], edim, store.initializer, config.seed)
            if config.accessor.embedx_threshold == 0:
                fill_initial(out, where, keys[where], config.embedx_dim, config.initializer,
                             config.seed, column=edim, element=edim)  # fmt: skip
        return out

    def write_rows(
        self,
        keys: np.ndarray,
        rows: np.ndarray,
        shows: np.ndarray | None = None,
        clicks: np.ndarray | None = None,
    ) -> None:
        """Upsert full rows: embedding and state overwritten, counters added (docstring).

        Args:
            keys: uint64 ``[n]``, unique.
            rows: float32 ``[n, dim + state_dim]``, C-contiguous, finite.
            shows: float32 ``[n]`` >= 0, or None for 1 per key (as ``push_delta``).
            clicks: float32 ``[n]`` >= 0, or None for 0.

        Raises:
            InputError: a dtype, shape or contiguity problem, a repeated key or a NaN/inf
                value; the table is unchanged.
            ResourceError: out of memory; the table is unchanged.
        """
        op = "write_rows"
        store = self.storage
        keys = checks.check_key_array(op, keys)
        n = keys.shape[0]
        rows = checks.check_matrix(op, "rows (embedding + optimizer state)", rows, n,
                                   self.full_width)  # fmt: skip
        shows = checks.counts_or_default(op, "shows", shows, n, 1.0)
        clicks = checks.counts_or_default(op, "clicks", clicks, n, 0.0)
        checks.check_finite(op, "rows", rows, keys)
        if has_repeats(keys):
            raise InputError(
                f"{op} to table {store.config.name!r}: keys must be unique (a row is written "
                "once per request); nothing was written"
            )
        if n == 0:
            return
        # -- stage the whole new rows aside: nothing here changes the table ---------------
        ids = store.index.find(keys)
        staged = np.empty((n, store.layout.width), np.float32)
        old, new = np.flatnonzero(ids >= 0), np.flatnonzero(ids < 0)
        if old.size:  # existing rows keep their counters
            current = np.empty((old.size, store.layout.width), np.float32)
            tier = store.tier
            if tier is None:
                gather_rows(store.rows, ids[old], current)
            else:
                with tier.lock:
                    slots = tier.gather_slots(ids[old], op)  # first: it may move the cache
                    gather_rows(tier.cache, slots, current)
            staged[old] = current
        pending = np.empty(0, np.uint64)
        if new.size:  # new rows start from their pending counters, if any
            pids = store.pending_index.find(keys[new])
            held = pids >= 0
            prior = np.zeros((new.size, 2), np.float32)
            prior[held] = store.pending[pids[held], :2]  # PENDING_WHERE: show 0, click 1
            pending = np.ascontiguousarray(keys[new][held])
            policy = store.config.lifecycle
            init_rows(staged, new, store.state0, np.ascontiguousarray(prior[:, 0]),
                      np.ascontiguousarray(prior[:, 1]), store.dim, store.stat0,
                      policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
        policy = store.config.lifecycle
        touch_rows(staged, np.arange(n, dtype=np.int64), shows, clicks, store.stat0,
                   policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
        if store.split:
            self._write_split(keys, ids, rows, staged)
            return
        staged[:, : self.full_width] = rows
        check_staged(op, store.config.name, staged, keys, "row")
        # -- commit ---------------------------------------------------------------------
        store.grow(op, new.size, 0, pending_erases=pending.size)
        if new.size:
            ids[new] = store.index.find_or_insert(np.ascontiguousarray(keys[new]))[0]
        if store.tier is None:
            scatter_rows(store.rows, ids, staged)
        else:
            store.tier.write(ids, staged, op)
        if pending.size:
            store.pending_index.erase(pending)

    def _write_split(self, keys, ids, rows, staged) -> None:
        """:meth:`write_rows` of a split table: the counters staged as for any table, the
        row's parts overwritten; a row keeps (or gets) an embedx part if it had one or its
        new score reaches ``embedx_threshold``."""
        store = self.storage
        stat0, dim = store.stat0, store.config.dim
        has = np.zeros(keys.shape[0], np.bool_)
        old = np.flatnonzero(ids >= 0)
        has[old] = store.embedx.xids_of(ids[old]) >= 0  # type: ignore[union-attr]
        columns = {
            "key": keys,
            "embedding": np.ascontiguousarray(rows[:, :dim]),
            "state": np.ascontiguousarray(rows[:, dim:]),
            "show": np.ascontiguousarray(staged[:, stat0]),
            "click": np.ascontiguousarray(staged[:, stat0 + 1]),
            "delta_score": np.ascontiguousarray(staged[:, stat0 + 2]),
            "unseen_days": np.zeros(keys.shape[0], np.int32),
            "touched": np.ones(keys.shape[0], np.uint8),
        }
        has |= embedx_mask(store, columns)
        columns["has_embedx"] = has.astype(np.uint8)
        import_split(store, columns, "write_rows", strict=False, refuse=None)
