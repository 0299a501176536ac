"""``SparseTable``: one shard of a sparse embedding table (DESIGN §2.5).

Storage: a :class:`~sparseps.table.hashmap.KeyIndex` maps each live key to a dense row
id; rows live in one float32 matrix laid out by :class:`~sparseps.table.layout.RowLayout`.
Erased ids go to a free stack and are reused first, so the matrix only grows when the
number of live rows does. It doubles while small and then grows by 25% (bounded memory
overhead at tens of millions of rows, see docs/table.md). Keys that are not admitted yet
live in a second, small index with only their counters (show, click, unseen).

Push path (all compiled, one pass each): merge repeated keys -> find (or find-or-insert
for admission "always") -> admission of missing keys -> statistics -> the rule's fused
update over the touched rows.

Semantics pinned here:

- A push validates everything first and is all-or-nothing: a NaN/inf gradient anywhere
  rejects the whole batch (InputError naming the count and the first key) and the table
  is left unchanged.
- On the push that admits a key, the row is created with its initial value, its counters
  start from the pending counters, and *that push's gradient is applied* (so the first
  admitted push is not wasted). Pushes before admission only add to the counters.
- ``pull`` never changes state. For admission "always" a never-seen key returns the
  initial value the first push will create; otherwise missing keys return zeros.
"""

from __future__ import annotations

import logging
import numbers
from dataclasses import dataclass

import numpy as np

from ..config import Admission, TableConfig
from ..errors import ConfigError, InputError
from . import checks
from .batch import add_rows, dedup_merge, gather, init_rows, touch_rows
from .columns import (
    OPTIONAL_PENDING_COLUMNS,
    OPTIONAL_ROW_COLUMNS,
    PENDING_COLUMNS,
    ROW_COLUMNS,
    check_columns,
    gather_columns,
    write_stats,
)
from .hashmap import KeyIndex
from .initializers import fill_initial
from .layout import STAT_COLUMNS, RowLayout
from .lifecycle import admit, decay_slots, shrink_select

__all__ = ["SparseTable", "TableStats"]

log = logging.getLogger(__name__)

INITIAL_ROWS = 256
DOUBLING_BYTES = 64 << 20  # below this a matrix doubles; above it grows by 25%
# pending storage columns: no embedding, state or delta_score
PENDING_WHERE = {"show": 0, "click": 1, "unseen": 2}


@dataclass(frozen=True)
class TableStats:
    """A snapshot of a table's size.

    Attributes:
        name: table name.
        rows: live (admitted) rows.
        pending: keys seen but not admitted yet.
        capacity: rows the storage matrix can hold before it grows.
        bytes_used: bytes held by storage, hash indexes and pending counters.
        dim: embedding width.
    """

    name: str
    rows: int
    pending: int
    capacity: int
    bytes_used: int
    dim: int


def _grown(array: np.ndarray, needed: int) -> np.ndarray:
    """``array`` with at least ``needed`` rows (contents kept), reallocating if short.

    Growth copies into a new matrix rather than resizing in place: a reader that still
    holds the old matrix (a pull racing a push when a caller forgets its lock) then reads
    stale rows instead of freed memory. The price is old + new memory during the copy.
    """
    capacity = array.shape[0]
    if needed <= capacity:
        return array
    step = capacity if array.nbytes < DOUBLING_BYTES else capacity // 4
    new = np.empty((max(needed, capacity + step), array.shape[1]), array.dtype)
    new[:capacity] = array
    return new


class SparseTable:
    """One shard of a sparse table.

    Not thread-safe for writers: the owner serialises mutating calls (the server holds a
    per-table write lock); concurrent ``pull`` calls are safe and release the GIL in the
    compiled kernels.

    Args:
        config: the table's :class:`~sparseps.config.TableConfig`.
    """

    def __init__(self, config: TableConfig) -> None:
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
        self._index = KeyIndex()
        self._rows = np.empty((INITIAL_ROWS, self.layout.width), np.float32)
        self._pending_index = KeyIndex()
        self._pending = np.empty((16, len(PENDING_WHERE)), np.float32)

    # -- size -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return (
            self._rows.nbytes
            + self._index.nbytes
            + self._pending.nbytes
            + self._pending_index.nbytes
        )

    def stats(self) -> TableStats:
        return TableStats(
            name=self.config.name,
            rows=len(self._index),
            pending=len(self._pending_index),
            capacity=int(self._rows.shape[0]),
            bytes_used=int(self.nbytes),
            dim=self._dim,
        )

    def reserve(self, rows: int) -> None:
        """Pre-size storage for ``rows`` live rows (e.g. before loading a checkpoint)."""
        if rows > self._rows.shape[0]:
            new = np.empty((rows, self.layout.width), np.float32)
            new[: self._rows.shape[0]] = self._rows
            self._rows = new

    def keys(self) -> np.ndarray:
        """uint64 keys of the live rows (slot order)."""
        return self._index.items()[0]

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """bool ``[n]``: whether each key is a live row."""
        return self._index.contains(checks.check_keys("contains", keys))

    # -- pull / push ------------------------------------------------------------------
    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Embeddings of ``keys`` (uint64 ``[n]``, any order, repeats allowed).

        Returns:
            A fresh float32 ``[n, dim]`` array. Rows not admitted yet are zeros, except
            with admission "always", where a never-seen key gets its initial value.

        Raises:
            InputError: ``keys`` is not a C-contiguous 1-D uint64 array.
        """
        keys = checks.check_keys("pull", keys)
        ids = self._index.find(keys)
        out, missing = gather(self._rows, ids, self._dim)
        if missing and self._always:
            where = np.flatnonzero(ids < 0)
            fill_initial(
                out, where, keys[where], self._dim, self.config.initializer, self.config.seed
            )
        return out

    def push(self, keys: np.ndarray, grads: np.ndarray, shows=None, clicks=None) -> None:
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

    def push_delta(self, keys: np.ndarray, deltas: np.ndarray, shows=None, clicks=None) -> None:
        """Geo mode: ``embedding += delta`` per key (merged), no optimizer rule or clip.

        Same arguments, validation, admission and statistics as :meth:`push`.
        """
        self._apply("push_delta", keys, deltas, "deltas", shows, clicks, delta=True)

    def _apply(self, op, keys, values, name, shows, clicks, *, delta: bool) -> None:
        keys = checks.check_keys(op, keys)
        n = keys.shape[0]
        values = checks.check_matrix(op, name, values, n, self._dim)
        shows = checks.check_counts(op, "shows", shows, n, 1.0)
        clicks = checks.check_counts(op, "clicks", clicks, n, 0.0)
        checks.check_finite(op, name, values, keys)
        if n == 0:
            return
        uniq, merged, merged_shows, merged_clicks = dedup_merge(keys, values, shows, clicks)
        rows = self._rows_for(uniq, merged_shows, merged_clicks)
        if not self._always:
            keep = np.flatnonzero(rows >= 0)
            if keep.size < rows.size:  # gradients of keys still pending are dropped
                rows, merged = rows[keep], np.ascontiguousarray(merged[keep])
                merged_shows, merged_clicks = merged_shows[keep], merged_clicks[keep]
        policy = self._policy
        touch_rows(self._rows, rows, merged_shows, merged_clicks, self._stat0,
                   policy.nonclick_coeff, policy.click_coeff)  # fmt: skip
        if delta:
            add_rows(self._rows, rows, merged, self._dim)
        else:
            self.config.rule.update(self._rows, rows, merged, self._dim)

    def _rows_for(self, keys, shows, clicks) -> np.ndarray:
        """Row ids of unique ``keys``, creating admitted rows; -1 for keys still pending."""
        if self._always:
            ids, is_new = self._index.find_or_insert(keys)
            if is_new.any():
                zeros = np.zeros(int(is_new.sum()), np.float32)
                self._create(ids[is_new], keys[is_new], zeros, zeros)
            return ids
        ids = self._index.find(keys)
        missing = np.flatnonzero(ids < 0)
        if missing.size == 0:
            return ids
        waiting = keys[missing]
        pids, is_new = self._pending_index.find_or_insert(waiting)
        self._pending = _grown(self._pending, self._pending_index.high_water)
        admitted, prior_show, prior_click = admit(
            self._pending, pids, is_new, waiting, shows[missing], clicks[missing], self._policy,
            self.config.seed,
        )  # fmt: skip
        if admitted.any():
            fresh = waiting[admitted]
            self._pending_index.erase(fresh)
            new_ids, _ = self._index.find_or_insert(fresh)
            self._create(new_ids, fresh, prior_show[admitted], prior_click[admitted])
            ids[missing[admitted]] = new_ids
        return ids

    def _create(self, ids, keys, shows, clicks) -> None:
        """Initialise new rows: initial embedding, initial state, counters from admission."""
        self._rows = _grown(self._rows, self._index.high_water)
        fill_initial(self._rows, ids, keys, self._dim, self.config.initializer, self.config.seed)
        init_rows(self._rows, ids, self._state0, shows, clicks, self._dim, self._stat0,
                  self._policy.nonclick_coeff, self._policy.click_coeff)  # fmt: skip

    # -- lifecycle --------------------------------------------------------------------
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
        skeys, svals, sstate = self._index.slots()
        decay_slots(sstate, svals, self._rows, self._stat0, self._where["unseen"], float(rate))
        skeys, svals, sstate = self._pending_index.slots()
        decay_slots(sstate, svals, self._pending, 0, 2, float(rate))

    def shrink(self) -> np.ndarray:
        """Delete rows with ``score < shrink_score`` or ``unseen_days > shrink_unseen_days``.

        Pending keys matching the same rule are forgotten as well. The freed row memory is
        reused by later inserts.

        Returns:
            The deleted rows' keys, sorted uint64 (pending keys are not listed).
        """
        dead = shrink_select(
            self._index, self._rows, self._stat0, self._where["unseen"], self._policy
        )
        self._index.erase(dead)
        forgotten = shrink_select(self._pending_index, self._pending, 0, 2, self._policy)
        self._pending_index.erase(forgotten)
        log.info(
            "table %s: shrink deleted %d rows and %d pending keys; %d rows left",
            self.config.name, dead.size, forgotten.size, len(self._index),
        )  # fmt: skip
        return dead

    def reset_delta_score(self) -> None:
        """Zero every row's delta_score (after a delta save)."""
        self._rows[: self._index.high_water, self._where["delta_score"]] = 0.0

    # -- export / import --------------------------------------------------------------
    def export_rows(self) -> dict[str, np.ndarray]:
        """Every live row as columns (order unspecified, consistent across columns).

        Returns:
            ``key`` uint64 [n], ``embedding`` float32 [n, dim], ``state`` float32
            [n, state_dim], ``show``/``click``/``delta_score`` float32 [n],
            ``unseen_days`` int32 [n] and ``touched`` uint8 [n] (1 = pushed since the last
            decay; optional on import, default 0).
        """
        keys, ids = self._index.items()
        columns = gather_columns(self._rows, keys, ids, self._where)
        return {name: columns[name] for name in (*ROW_COLUMNS, *OPTIONAL_ROW_COLUMNS)}

    def export_pending(self) -> dict[str, np.ndarray]:
        """Admission counters of keys not admitted yet: ``key``, ``show``, ``click``
        (+ ``unseen_days`` int32 and ``touched`` uint8, optional on import)."""
        keys, ids = self._pending_index.items()
        columns = gather_columns(self._pending, keys, ids, PENDING_WHERE)
        return {name: columns[name] for name in (*PENDING_COLUMNS, *OPTIONAL_PENDING_COLUMNS)}

    def import_rows(self, columns: dict) -> None:
        """Upsert rows from :meth:`export_rows` columns (bit-exact round trip).

        A key that was pending becomes a row (its pending counters are dropped).

        Raises:
            InputError: a missing or unknown column, a wrong dtype/shape (e.g. an
                embedding of another dim), lengths that differ, repeated keys or
                non-finite values; nothing is imported then.
        """
        layout = self.layout
        cols = check_columns("import_rows", columns, ROW_COLUMNS, OPTIONAL_ROW_COLUMNS,
                              layout.dim, layout.state_dim)  # fmt: skip
        keys = cols["key"]
        if keys.size == 0:
            return
        ids, _ = self._index.find_or_insert(keys)
        self._rows = _grown(self._rows, self._index.high_water)
        self._rows[ids, : self._dim] = cols["embedding"]
        self._rows[ids, self._dim : self._stat0] = cols["state"]
        write_stats(self._rows, ids, cols, self._where)
        self._pending_index.erase(keys)

    def import_pending(self, columns: dict) -> None:
        """Upsert pending counters from :meth:`export_pending` columns.

        Keys that are already rows are skipped (a row supersedes its pending counters).

        Raises:
            InputError: as :meth:`import_rows`.
        """
        cols = check_columns(
            "import_pending", columns, PENDING_COLUMNS, OPTIONAL_PENDING_COLUMNS, 0, 0
        )
        keep = np.flatnonzero(~self._index.contains(cols["key"]))
        if keep.size < cols["key"].size:
            log.info("table %s: import_pending skipped %d keys that are rows",
                     self.config.name, cols["key"].size - keep.size)  # fmt: skip
            cols = {name: values[keep] for name, values in cols.items()}
        if cols["key"].size == 0:
            return
        ids, _ = self._pending_index.find_or_insert(np.ascontiguousarray(cols["key"]))
        self._pending = _grown(self._pending, self._pending_index.high_water)
        write_stats(self._pending, ids, cols, PENDING_WHERE)
