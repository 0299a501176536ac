"""The end of a day and the moves of shards, table-wide: decay, shrink, drop, delta reset.

Mixed into :class:`~sparseps.table.SparseTable` (as :mod:`~sparseps.table.full_rows`
and :mod:`~sparseps.table.restore` are): each op runs the same compiled pass over the
rows in memory or, for a tiered table, over the tier (:mod:`~sparseps.table.tier`), and
the same pass over the pending keys' counters. The rules themselves (scores, what decays,
what a shrink selects) are :mod:`~sparseps.table.lifecycle`'s.
"""

from __future__ import annotations

import logging
import numbers

import numpy as np

from ..errors import InputError
from . import input_checks as checks
from .lifecycle import decay_slots, shrink_select, shrink_select_rows
from .table_parts import TableParts

__all__ = ["LifecycleOps"]

log = logging.getLogger(__name__)


class LifecycleOps(TableParts):
    """``decay`` / ``shrink`` / ``drop`` / ``reset_delta_score`` of a sparse table."""

    def decay(self, rate: float | None = None) -> None:
        """End of a day: show, click *= rate; unseen_days += 1 for rows not pushed since
        the previous decay (rows pushed since then stay at 0). Pending counters too.

        Args:
            rate: in (0, 1]; None uses ``lifecycle.decay_rate``.
        """
        if rate is None:
            rate = self._policy.decay_rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 < rate <= 1.0:
            raise InputError(f"decay: rate must be a number in (0, 1], found {rate!r}")
        if self._tier is None:
            skeys, svals, sstate = self._index.slots()
            decay_slots(sstate, svals, self._rows, self._stat0, self._where["unseen"], float(rate))
        else:
            self._tier.decay(self._stat0, self._where["unseen"], float(rate))
        skeys, svals, sstate = self._pending_index.slots()
        decay_slots(sstate, svals, self._pending, 0, 2, float(rate))

    def drop(self, keys: np.ndarray) -> int:
        """Delete these keys' rows and pending counters (absent keys are ignored): the rows
        of a virtual shard that moved to another server. Returns the rows deleted."""
        keys = checks.check_key_array("drop", keys)
        freed = self._index.erase(keys)
        if self._tier is not None:
            self._tier.forget(freed[freed >= 0])
        self._pending_index.erase(keys)
        return int(np.count_nonzero(freed >= 0))

    def shrink(self) -> np.ndarray:
        """Delete rows with ``score < shrink_score`` or ``unseen_days > shrink_unseen_days``.

        Pending keys matching the same rule are forgotten as well. The freed row memory is
        reused by later inserts.

        Returns:
            The deleted rows' keys, sorted uint64 (pending keys are not listed).
        """
        unseen = self._where["unseen"]
        if self._tier is None:
            dead = shrink_select(self._index, self._rows, self._stat0, unseen, self._policy)
            self._index.erase(dead)
        else:  # the deleted rows leave the disk too: zeroed, their space reused
            keys, where, disk = self._tier.scan(self._index, "shrink")
            dead = shrink_select_rows(keys, where, disk, self._stat0, unseen, self._policy)
            self._tier.forget(self._index.erase(dead))
            self._tier.drop_pages()
        forgotten = shrink_select(self._pending_index, self._pending, 0, 2, self._policy)
        self._pending_index.erase(forgotten)
        log.info(
            "table %s: shrink deleted %d rows and %d pending keys; %d rows left",
            self.config.name, dead.size, forgotten.size, len(self._index),
        )  # fmt: skip
        return dead

    def reset_delta_score(self) -> None:
        """Zero every row's delta_score (after a delta save)."""
        if self._tier is None:
            self._rows[: self._index.high_water, self._where["delta_score"]] = 0.0
        else:
            self._tier.set_column(self._where["delta_score"], 0.0)
