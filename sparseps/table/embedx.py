"""``EmbedxStore``: the embedx parts of a split table's rows, stored only for the rows
that earned one (:class:`~sparseps.config.Accessor`).

A split table keeps, per live row, its *base row* in the table's row matrix (the embed
part: ``embed_w`` and its state, then show, click, delta_score, unseen; a normal
:class:`~sparseps.table.layout.RowLayout` of width ``embed_dim``) and, per base row id,
an ``xid``: where its embedx part is, or -1 while it has none. The embedx parts live in
a second matrix of :class:`EmbedxLayout` rows, handed out and reused like the index's
row ids (a free stack first, then the next never-used one). With a memory budget the
embedx rows live in a :class:`~sparseps.table.tier.RowTier` of their own (a cache over a
row file), like the base rows.

Worked example (embedx dim 4, SparseAdagrad: one g2sum)::

    float32 embedx row:  [w0 w1 w2 w3 | g2sum]        (a rule's [embedding | state])
    float16 embedx row:  [g2sum | w0 w1 | w2 w3]      (two halves per float32 word)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import EmbedxDtype, TableConfig
from ..core.closing import Closing
from ..core.jit import njit
from .growth import Allocator, GrowableMatrix
from .tier import RowTier, tier_for

__all__ = ["EmbedxLayout", "EmbedxStore"]

_INITIAL_ROWS = 64


@dataclass(frozen=True)
class EmbedxLayout:
    """The columns of a stored embedx part.

    Attributes:
        dim: embedx width (``config.dim - accessor.embed_dim``).
        state_dim: the embedx rule's state floats.
        half: weights stored as float16 after the state (else float32 before it, the
            layout every rule's kernel takes).
    """

    dim: int
    state_dim: int
    half: bool

    @classmethod
    def of(cls, config: TableConfig) -> EmbedxLayout:
        accessor = config.accessor
        return cls(
            dim=config.embedx_dim,
            state_dim=config.rule.state_dim(config.embedx_dim),
            half=accessor.embedx_dtype is EmbedxDtype.FLOAT16,
        )

    @property
    def words(self) -> int:
        """float32 words per stored row."""
        if self.half:
            return self.state_dim + (self.dim + 1) // 2
        return self.dim + self.state_dim

    @property
    def state_column(self) -> int:
        """The first state column (float32 words)."""
        return 0 if self.half else self.dim

    @property
    def weight_column(self) -> int:
        """The first weight: a float32 column, or (half) a column of the uint16 view."""
        return 2 * self.state_dim if self.half else 0

    @property
    def row_bytes(self) -> int:
        return 4 * self.words


@njit(nogil=True, cache=True)
def _xids_of(xids, ids, out):  # pragma: no cover - compiled
    for i in range(ids.shape[0]):
        r = ids[i]
        out[i] = xids[r] if r >= 0 else -1


class EmbedxStore(Closing):
    """The embedx parts of one table's rows and each base row's ``xid``.

    Args:
        config: the table's config (split: ``config.accessor.split``).
        allocator: the memory hook.
        disk_dir: where a tiered table's embedx rows live (its memory budget is
            ``config.memory_rows`` embedx rows).
        budget_bytes: the bytes a row counts for ``config.memory_bytes`` (see tier_for).
    """

    def __init__(self, config: TableConfig, allocator: Allocator | None,
                 disk_dir: str | None, budget_bytes: int | None = None) -> None:  # fmt: skip
        self.config = config
        self.layout = EmbedxLayout.of(config)
        self.state0 = np.ascontiguousarray(config.rule.initial_state(self.layout.dim), np.float32)
        self.allocator = allocator
        self.budget_bytes = budget_bytes
        self.tier: RowTier | None = None
        if config.tiered:
            self.tier = tier_for(config, self.layout.words, disk_dir, allocator,
                                 suffix="embedx", budget_bytes=budget_bytes)  # fmt: skip
        initial = 0 if self.tier is not None else _INITIAL_ROWS
        self.matrix = GrowableMatrix(initial, self.layout.words, np.float32, allocator,
                                     divisor=8, doubling_bytes=8 << 20)  # fmt: skip
        self.ids = GrowableMatrix(0, 1, np.int32, allocator)  # base row id -> xid
        self.high_water = 0
        self.free = np.empty(0, np.int64)
        self.nfree = 0

    # -- sizes ------------------------------------------------------------------------
    @property
    def live(self) -> int:
        """Rows that have an embedx part."""
        return self.high_water - self.nfree

    @property
    def nbytes(self) -> int:
        tier = 0 if self.tier is None else self.tier.nbytes
        return self.matrix.nbytes + tier + self.ids.nbytes + self.free.nbytes

    @property
    def rows(self) -> np.ndarray:
        """The in-memory matrix (empty when tiered; re-read after any growth)."""
        return self.matrix.array

    @property
    def xids(self) -> np.ndarray:
        """int32 ``[base capacity]``: each base row's xid, -1 without an embedx part."""
        return self.ids.array.reshape(-1)

    def xids_of(self, ids: np.ndarray) -> np.ndarray:
        """int64 xids of base row ids (-1 for an id < 0 or a row without an embedx part)."""
        out = np.empty(ids.shape[0], np.int64)
        _xids_of(self.xids, ids, out)
        return out

    # -- growth -----------------------------------------------------------------------
    def grow_ids(self, needed: int, *, exact: bool = False) -> None:
        """Hold an xid for base row ids ``< needed`` (new ones read -1)."""
        before = self.ids.capacity
        if needed <= before:
            return
        self.ids.grow_to(needed, exact=exact)
        self.ids.array[before:] = -1

    def bytes_to_reserve(self, base_rows: int, rows: int) -> int:
        needed = self.high_water + max(0, rows - self.nfree)
        store = self.matrix if self.tier is None else self.tier
        return self.ids.bytes_to_hold(base_rows) + store.bytes_to_hold(needed)

    def reserve(self, rows: int, op: str) -> None:
        """Room for ``rows`` new embedx parts (MemoryError/ResourceError: unchanged)."""
        needed = self.high_water + max(0, rows - self.nfree)
        if self.tier is None:
            self.matrix.grow_to(needed)
        else:
            self.tier.grow_to(needed, op)

    def allocate(self, count: int) -> np.ndarray:
        """``count`` xids (reserved before): freed ones first, then new ones."""
        take = min(count, self.nfree)
        out = np.empty(count, np.int64)
        out[:take] = self.free[self.nfree - take : self.nfree][::-1]
        self.nfree -= take
        fresh = count - take
        out[take:] = np.arange(self.high_water, self.high_water + fresh, dtype=np.int64)
        self.high_water += fresh
        return out

    def release(self, base_ids: np.ndarray) -> int:
        """The base rows ``base_ids`` (>= 0 where deleted) lost their rows: free their
        embedx parts. Returns how many were freed."""
        base_ids = base_ids[base_ids >= 0]
        if base_ids.size == 0:
            return 0
        xids = self.xids
        held = xids[base_ids]
        gone = held[held >= 0].astype(np.int64)
        xids[base_ids] = -1
        if gone.size:
            if self.tier is not None:
                self.tier.forget(gone)
            if self.free.shape[0] < self.nfree + gone.size:  # freeing may allocate (as an erase)
                grown = np.empty(max(64, self.nfree + gone.size, 2 * self.free.shape[0]), np.int64)
                grown[: self.nfree] = self.free[: self.nfree]
                self.free = grown
            self.free[self.nfree : self.nfree + gone.size] = gone
            self.nfree += gone.size
        return int(gone.size)

    def take(self, other: EmbedxStore) -> None:
        """Hold ``other``'s contents (a restore's swap); ``other`` is left empty."""
        folder = None if other.tier is None else other.tier.folder
        fresh = EmbedxStore(other.config, other.allocator, folder, other.budget_bytes)
        old_tier = self.tier
        for name in ("tier", "matrix", "ids", "high_water", "free", "nfree"):
            setattr(self, name, getattr(other, name))
            setattr(other, name, getattr(fresh, name))
        if old_tier is not None:
            old_tier.close()

    def close(self) -> None:
        if self.tier is not None:
            self.tier.close()
