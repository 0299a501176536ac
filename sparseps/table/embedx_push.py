"""The embedx half of a split table's push (:class:`~sparseps.config.Accessor`).

The table's :class:`~sparseps.table.push.PushTransaction` updates the base rows (the
embed part by the embed rule, the counters); after their counters include the push, this
part decides per touched row, by its show/click score::

    has an embedx part                      -> the embedx rule's step with its gradient
    none, score >= embedx_threshold         -> created now: initial value and state,
                                               then this push's step (as an admitted
                                               row's first push is applied)
    none, score <  embedx_threshold         -> its embedx gradient is dropped

in the transaction's phases: existing embedx parts are updated in place after a backup
(:meth:`EmbedxPush.rollback` writes it back if anything fails before the commit), new
ones are built and checked aside, and :meth:`EmbedxPush.commit` hands out their xids and
writes them (room was reserved by the table's growth, so it allocates nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.jit import njit
from ..errors import InputError
from ..optim.half import float_to_half, floats_to_halves, half_to_float
from .batch import add_rows
from .initializers import fill_initial
from .push import check_rows, check_staged, gather_rows, scatter_rows

if TYPE_CHECKING:
    from .storage import TableStorage

__all__ = ["EmbedxPush", "create_rows", "half_rows_finite"]


@njit(nogil=True, cache=True)
def _scores(rows, slots, stat0, nonclick, click_coeff, out):  # pragma: no cover - compiled
    for i in range(slots.shape[0]):
        r = slots[i]
        show = np.float64(rows[r, stat0])
        click = np.float64(rows[r, stat0 + 1])
        out[i] = (show - click) * nonclick + click * click_coeff


def scores(rows: np.ndarray, slots: np.ndarray, stat0: int, policy) -> np.ndarray:
    """float64 show/click score of the base rows ``slots`` of ``rows``."""
    out = np.empty(slots.shape[0], np.float64)
    _scores(rows, slots, stat0, policy.nonclick_coeff, policy.click_coeff, out)
    return out


@njit(nogil=True, cache=True)
def _add_half(halves, rows, deltas, dim, first):  # pragma: no cover - compiled
    finite = True
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(dim):
            x = half_to_float(halves[r, first + j]) + np.float64(deltas[i, j])
            finite &= abs(x) <= 65504.0
            halves[r, first + j] = float_to_half(x)
    return finite


@njit(nogil=True, cache=True)
def _half_rows_finite(halves, rows, first, dim):  # pragma: no cover - compiled
    for i in range(rows.shape[0]):
        for j in range(dim):
            if (halves[rows[i], first + j] & 0x7C00) == 0x7C00:
                return False
    return True


def half_rows_finite(matrix: np.ndarray, slots: np.ndarray, layout) -> bool:
    """Whether the float16 weights and float32 state of embedx rows ``slots`` are finite."""
    state = matrix[slots, : layout.state_dim]
    halves = matrix.view(np.uint16)
    return bool(np.isfinite(state).all()) and _half_rows_finite(
        halves, slots, layout.weight_column, layout.dim
    )


def create_rows(storage: TableStorage, keys: np.ndarray, out: np.ndarray) -> None:
    """New embedx parts of ``keys`` in ``out`` ``[n, words]``: the initializer's values
    (elements ``embed_dim ..`` of each key's vector) and the rule's initial state."""
    store = storage.embedx
    assert store is not None
    layout, config = store.layout, storage.config
    local = np.arange(keys.shape[0], dtype=np.int64)
    edim = config.accessor.embed_dim
    if layout.half:
        values = np.empty((keys.shape[0], layout.dim), np.float32)
        fill_initial(values, local, keys, layout.dim, config.initializer, config.seed,
                     element=edim)  # fmt: skip
        out[:, : layout.state_dim] = store.state0
        out[:, layout.state_dim :] = 0.0  # the pad half of an odd dim
        halves = out.view(np.uint16)
        first = layout.weight_column
        floats_to_halves(values, halves[:, first : first + layout.dim])
    else:
        fill_initial(out, local, keys, layout.dim, config.initializer, config.seed,
                     element=edim)  # fmt: skip
        out[:, layout.dim :] = store.state0


@dataclass
class _Created:
    old: np.ndarray  # positions among the push's existing rows that get an embedx now
    new: np.ndarray  # positions among the push's new rows that get one
    rows: np.ndarray  # [old.size + new.size, words], built and stepped aside


class EmbedxPush:
    """The embedx half of a split table's pushes, on its storage (see the module doc)."""

    def __init__(self, storage: TableStorage) -> None:
        self.storage = storage
        words = storage.embedx.layout.words if storage.embedx is not None else 0
        self._scratch = {"backup": np.empty((0, words), np.float32),
                         "created": np.empty((0, words), np.float32)}  # fmt: skip
        self._restore: tuple[np.ndarray, np.ndarray] | None = None
        self._created: _Created | None = None

    def _scratch_rows(self, which: str, rows: int) -> np.ndarray:
        scratch = self._scratch[which]
        if scratch.shape[0] < rows:
            scratch = np.empty((max(rows, 2 * scratch.shape[0]), scratch.shape[1]), np.float32)
            self._scratch[which] = scratch
        return scratch[:rows]

    def _matrix(self) -> np.ndarray:
        store = self.storage.embedx
        assert store is not None
        return store.rows if store.tier is None else store.tier.cache

    def _step(self, matrix, slots, grads, delta: bool) -> bool:
        store = self.storage.embedx
        assert store is not None
        layout, rule = store.layout, self.storage.config.rule
        if layout.half:
            halves = matrix.view(np.uint16)
            if delta:
                return bool(_add_half(halves, slots, grads, layout.dim, layout.weight_column))
            return rule.update_half(matrix, halves, slots, grads, layout.dim) is True
        step = add_rows if delta else rule.update
        return step(matrix, slots, grads, layout.dim) is True

    def _check(self, op: str, matrix, slots, keys) -> None:
        store = self.storage.embedx
        assert store is not None
        table = self.storage.config.name
        if not store.layout.half:
            check_rows(op, table, matrix, slots, keys, "embedx part")
        elif not half_rows_finite(matrix, slots, store.layout):
            raise InputError(
                f"{op} to table {table!r}: the update would make an embedx part non-finite "
                f"(among {slots.size} rows, first key {int(keys[0])}): rejected, the table is "
                "unchanged; lower the learning rate or the gradients"
            )

    def apply(self, op: str, base, old_slots, old_ids, old_keys, old_grads, fresh, new_keys,
              new_grads, *, delta: bool) -> int:  # fmt: skip
        """Step the existing embedx parts in place (backed up) and build the new ones.

        Args:
            base: the base rows' matrix (or the tier's cache) after the push's counters.
            old_slots, old_ids, old_keys: the push's existing rows: where their base rows
                are, their ids, their keys.
            old_grads, new_grads: the embedx columns of the merged gradients.
            fresh, new_keys: the push's new base rows (built aside) and their keys.

        Returns:
            How many embedx parts the push creates (room the caller reserves).
        """
        storage = self.storage
        store = storage.embedx
        assert store is not None
        policy, stat0 = storage.policy, storage.stat0
        threshold = storage.config.accessor.embedx_threshold
        held = store.xids_of(old_ids)
        has = held >= 0
        upd = np.flatnonzero(has)
        old_score = scores(base, old_slots, stat0, policy)
        create_old = np.flatnonzero(~has & (old_score >= threshold))
        new_score = scores(fresh, np.arange(new_keys.shape[0], dtype=np.int64), stat0, policy)
        create_new = np.flatnonzero(new_score >= threshold)
        count = create_old.size + create_new.size
        if store.tier is not None:  # room for every part this push touches or creates
            store.tier.begin(upd.size + count, op, ids=held[upd], new_rows=count)
        if upd.size:
            xs = held[upd]
            slots = xs if store.tier is None else store.tier.slots(xs, op, dirty=True)
            matrix = self._matrix()
            backup = self._scratch_rows("backup", slots.size)
            gather_rows(matrix, slots, backup)
            self._restore = (slots, backup)
            grads = np.ascontiguousarray(old_grads[upd])
            if not self._step(matrix, slots, grads, delta):
                self._check(op, matrix, slots, old_keys[upd])
        if count:
            keys = np.concatenate([old_keys[create_old], new_keys[create_new]])
            rows = self._scratch_rows("created", count)
            create_rows(storage, keys, rows)
            grads = np.ascontiguousarray(
                np.concatenate([old_grads[create_old], new_grads[create_new]])
            )
            local = np.arange(count, dtype=np.int64)
            if not self._step(rows, local, grads, delta):
                self._check(op, rows, local, keys)
            if not store.layout.half:
                check_staged(op, storage.config.name, rows, keys, "embedx part")
            self._created = _Created(create_old, create_new, rows)
        return count

    def rollback(self) -> None:
        """Write the backed-up embedx parts back (the push failed before its commit)."""
        if self._restore is not None:
            slots, backup = self._restore
            scatter_rows(self._matrix(), slots, backup)
        self._restore = self._created = None

    def commit(self, op: str, old_ids: np.ndarray, new_ids: np.ndarray) -> None:
        """Hand out xids to the created parts and write them (room was reserved)."""
        created, self._created, self._restore = self._created, None, None
        if created is None:
            return
        store = self.storage.embedx
        assert store is not None
        xs = store.allocate(created.rows.shape[0])
        if store.tier is None:
            scatter_rows(store.rows, xs, created.rows)
        else:
            scatter_rows(store.tier.cache, store.tier.slots(xs, op, load=False, dirty=True),
                         created.rows)  # fmt: skip
        xids = store.xids
        split = created.old.size
        xids[old_ids[created.old]] = xs[:split]
        xids[new_ids[created.new]] = xs[split:]
