"""The end of a day and the moves of shards, table-wide: decay, shrink, drop, delta reset.

A part of :class:`~sparseps.table.SparseTable` (as :mod:`~sparseps.table.full_rows`
and :mod:`~sparseps.table.restore` are), on its storage: each op runs the same compiled
pass over the rows in memory or, for a tiered table, over the tier
(:mod:`~sparseps.table.tier`), and the same pass over the pending keys' counters. The rules themselves (scores, what decays,
what a shrink selects) are :mod:`~sparseps.table.lifecycle`'s.
"""

from __future__ import annotations

import logging
import numbers

import numpy as np

from ..errors import InputError
from . import input_checks as checks
from .lifecycle import decay_slots, reset_delta_rows, shrink_select, shrink_select_rows
from .storage import TableStorage

__all__ = ["LifecycleOps"]

log = logging.getLogger(__name__)


class LifecycleOps:
    """``decay`` / ``shrink`` / ``drop`` / ``reset_delta_score`` of a sparse table."""

    def __init__(self, storage: TableStorage) -> None:
        self.storage = storage

    def decay(self, rate: float | None = None) -> None:
        """End of a day: show, click *= rate; unseen_days += 1 for rows not pushed since
        the previous decay (rows pushed since then stay at 0). Pending counters too.

        Args:
            rate: in (0, 1]; None uses ``lifecycle.decay_rate``.
        """
        store = self.storage
        if rate is None:
            rate = store.policy.decay_rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 < rate <= 1.0:
            raise InputError(f"decay: rate must be a number in (0, 1], found {rate!r}")
        unseen = store.where["unseen"]
        if store.tier is None:
            skeys, svals, sstate = store.index.slots()
            decay_slots(sstate, svals, store.rows, store.stat0, unseen, float(rate))
        else:
            store.tier.decay(store.stat0, unseen, float(rate))
        skeys, svals, sstate = store.pending_index.slots()
        decay_slots(sstate, svals, store.pending, 0, 2, float(rate))

    def drop(self, keys: np.ndarray) -> int:
        """Delete these keys' rows and pending counters (absent keys are ignored): the rows
        of a virtual shard that moved to another server. Returns the rows deleted."""
        store = self.storage
        keys = checks.check_key_array("drop", keys)
        freed = store.index.erase(keys)
        if store.tier is not None:
            store.tier.forget(freed[freed >= 0])
        if store.embedx is not None:
            store.embedx.release(freed)
        store.pending_index.erase(keys)
        return int(np.count_nonzero(freed >= 0))

    def shrink(self) -> np.ndarray:
        """Delete rows with ``score < shrink_score`` or ``unseen_days > shrink_unseen_days``.

        Pending keys matching the same rule are forgotten as well. The freed row memory is
        reused by later inserts.

        Returns:
            The deleted rows' keys, sorted uint64 (pending keys are not listed).
        """
        store = self.storage
        unseen, policy, tier = store.where["unseen"], store.policy, store.tier
        if tier is None:
            dead = shrink_select(store.index, store.rows, store.stat0, unseen, policy)
            freed = store.index.erase(dead)
        else:  # the deleted rows leave the disk too: zeroed, their space reused
            keys, _, where, disk = tier.scan(store.index, "shrink")
            dead = shrink_select_rows(keys, where, disk, store.stat0, unseen, policy)
            freed = store.index.erase(dead)
            tier.forget(freed)
            tier.drop_pages()
        if store.embedx is not None:  # a deleted row's embedx part goes with it
            store.embedx.release(freed)
        forgotten = shrink_select(store.pending_index, store.pending, 0, 2, policy)
        store.pending_index.erase(forgotten)
        log.info(
            "table %s: shrink deleted %d rows and %d pending keys; %d rows left",
            store.config.name, dead.size, forgotten.size, len(store.index),
        )  # fmt: skip
        return dead

    def reset_delta_score(self) -> None:
        """After a delta save: zero the delta_score of the rows a delta save keeps
        (:func:`~sparseps.table.lifecycle.delta_keep`: Paddle's ``UpdateStatAfterSave``);
        the others keep theirs for a later delta. With the default accessor that is every
        row whose delta_score is > 0."""
        store = self.storage
        config = store.config
        if store.tier is None:
            rows = store.rows[: store.index.high_water]
            reset_delta_rows(rows, store.stat0, config.lifecycle, config.accessor)
        else:
            store.tier.map_rows(
                lambda rows: reset_delta_rows(rows, store.stat0, config.lifecycle, config.accessor)
            )
