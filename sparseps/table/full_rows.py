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
from .initializers import fill_initial
from .push import check_staged, gather_rows, scatter_rows
from .storage import TableStorage

__all__ = ["FullRows"]


class FullRows:
    """``pull_full`` / ``write_rows`` of a :class:`~sparseps.table.SparseTable`, on its storage."""

    def __init__(self, storage: TableStorage) -> None:
        self.storage = storage
        self.full_width = storage.layout.dim + storage.layout.state_dim

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
                    gather_rows(tier.cache, tier.gather_slots(ids[old], op), current)
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
