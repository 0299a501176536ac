"""``TableStorage``: where a sparse table's rows live, and the facts of its row layout that
every part of :class:`~sparseps.table.SparseTable` reads.

A :class:`~sparseps.table.hashmap.KeyIndex` maps each live key to a dense row id; rows
live in one float32 matrix laid out by :class:`~sparseps.table.layout.RowLayout`. Erased
ids go to a free stack and are reused first, so the matrix only grows when the number of
live rows does. It doubles while small and then grows by 25%, in place
(:mod:`~sparseps.table.growth`: never old + new at once), and each growth asks the kernel
for transparent huge pages under it (a hint: 2 MB pages keep a batch's scattered row
reads from missing the TLB on every row; where THP is off nothing changes; numpy asks
the same for the index's arrays). Keys that are not admitted yet
live in a second, small index with only their counters (show, click, unseen:
:data:`PENDING_WHERE`).

With ``config.memory_rows`` the rows live in a :class:`~sparseps.table.tier.RowTier`
instead (the matrix stays empty): a cache of the hot rows over a row file.

A *split* table (``config.accessor.split``: Paddle's CTR accessor) stores each row as a
base row (its embed part and counters: the row layout of width ``embed_dim`` under the
embed rule) and, once the row earned one, an embedx part in an
:class:`~sparseps.table.embedx.EmbedxStore`. ``layout`` is then the base row's;
``export_layout`` names the columns the table exchanges (a pull's ``dim`` embedding
columns, the embed state then the embedx state).

The table's parts (the push, pulls, export and import, whole rows, the lifecycle) read
and write this one object; :meth:`take` moves another storage's contents in at once (a
restore's swap).
"""

from __future__ import annotations

import numpy as np

from ..config import Admission, TableConfig
from ..core.closing import Closing
from ..errors import ResourceError
from .embedx import EmbedxLayout, EmbedxStore
from .growth import Allocator, GrowableMatrix
from .hashmap import KeyIndex
from .layout import STAT_COLUMNS, RowLayout
from .row_import import advise_huge_pages
from .tagged_index import TaggedIndex
from .tier import RowTier, tier_for

__all__ = ["INITIAL_ROWS", "PENDING_WHERE", "TableStorage"]

INITIAL_ROWS = 256
# a split table's small rows (and their keys, xids, embedx parts) grow by 1/8 past 8 MB
SPLIT_GROWTH = {"divisor": 8, "doubling_bytes": 8 << 20}
# pending storage columns: no embedding, state or delta_score
PENDING_WHERE = {"show": 0, "click": 1, "unseen": 2}


class TableStorage(Closing):
    """The key indexes, the rows (a matrix, or a tier) and the pending keys' counters of
    one table, with what its config says about a row.

    Args:
        config: the table's config.
        allocator: the memory hook (tests pass one that fails).
        disk_dir: the tier's folder (``config.memory_rows`` set), else unused.

    Raises:
        ConfigError: the config has a memory budget and there is no ``disk_dir``.
    """

    def __init__(
        self, config: TableConfig, *, allocator: Allocator | None, disk_dir: str | None
    ) -> None:
        self.config = config
        accessor = config.accessor
        self.split = accessor.split
        self.embedx: EmbedxStore | None = None
        if self.split:  # the base row is the embed part
            embed_rule = accessor.embed_rule_or(config.rule)
            self.rule = embed_rule  # the base rows' rule
            self.layout = RowLayout.for_rule(accessor.embed_dim, embed_rule)
            budget = 4 * self.layout.width + EmbedxLayout.of(config).row_bytes
            self.embedx = EmbedxStore(config, allocator, disk_dir, budget)
            self.export_layout = RowLayout.for_config(config)
            self.initializer = accessor.embed_initializer
            self.state0 = np.ascontiguousarray(embed_rule.initial_state(self.layout.dim),
                                               np.float32)  # fmt: skip
        else:
            self.rule = config.rule
            self.layout = self.export_layout = RowLayout.for_rule(config.dim, config.rule)
            self.initializer = config.initializer
            # the rule's initial state of a row
            self.state0 = np.ascontiguousarray(config.rule.initial_state(config.dim),
                                               np.float32)  # fmt: skip
        self.dim = self.layout.dim
        self.stat0 = self.layout.column("show")  # first statistics column of a row
        # first storage column of each exported field (see RowLayout)
        self.where = {"dim": self.dim, **{n: self.layout.column(n) for n in STAT_COLUMNS}}
        self.policy = config.lifecycle
        self.always = config.lifecycle.admission is Admission.ALWAYS
        self.allocator = allocator
        self.disk_dir = disk_dir
        self.tier: RowTier | None = tier_for(
            config, self.layout.width, disk_dir, allocator,
            budget_bytes=None if self.embedx is None else self.embedx.budget_bytes,
        )  # fmt: skip
        # a split table's base rows are small: its index keeps each key once (tagged_index.py)
        self.index = (
            TaggedIndex(allocator=allocator) if self.split else KeyIndex(allocator=allocator)
        )
        # a tiered table keeps its rows in the tier; this matrix stays empty
        initial = INITIAL_ROWS if self.tier is None else 0
        step = SPLIT_GROWTH if self.split else {}
        self.matrix = GrowableMatrix(initial, self.layout.width, np.float32, allocator, **step)
        self.pending_index = KeyIndex(allocator=allocator)
        self.pending_matrix = GrowableMatrix(16, len(PENDING_WHERE), np.float32, allocator)

    @property
    def rows(self) -> np.ndarray:
        """The row matrix (empty for a tiered table). Read it again after anything that
        may grow it: a growth replaces the array (see growth.py)."""
        return self.matrix.array

    @property
    def pending(self) -> np.ndarray:
        """The pending keys' counters (:data:`PENDING_WHERE`), by pending id."""
        return self.pending_matrix.array

    @property
    def nbytes(self) -> int:
        """Bytes of memory (a tiered table's disk file is not counted)."""
        tier = 0 if self.tier is None else self.tier.nbytes
        embedx = 0 if self.embedx is None else self.embedx.nbytes
        return (
            self.rows.nbytes
            + tier
            + embedx
            + self.index.nbytes
            + self.pending.nbytes
            + self.pending_index.nbytes
        )

    def empty_like(self) -> TableStorage:
        """An empty storage of the same config, allocator and disk dir."""
        return TableStorage(self.config, allocator=self.allocator, disk_dir=self.disk_dir)

    def take(self, other: TableStorage) -> None:
        """Hold ``other``'s rows, indexes and pending counters from now on; ``other`` is
        left empty. This storage's former contents are dropped (a tier's file now)."""
        fresh = other.empty_like()
        old_tier = self.tier
        self.index, self.matrix = other.index, other.matrix
        self.pending_index, self.pending_matrix = other.pending_index, other.pending_matrix
        self.tier = other.tier
        other.index, other.matrix = fresh.index, fresh.matrix
        other.pending_index, other.pending_matrix = fresh.pending_index, fresh.pending_matrix
        other.tier = fresh.tier
        if self.embedx is not None and other.embedx is not None:
            self.embedx.take(other.embedx)
        if old_tier is not None:  # the replaced contents' disk file goes now, not at GC
            old_tier.close()

    def close(self) -> None:
        """Delete a tier's disk file (the storage must not be used afterwards)."""
        if self.tier is not None:
            self.tier.close()
        if self.embedx is not None:
            self.embedx.close()

    def grow(self, op: str, rows: int, pending: int, *, pending_erases: int = 0,
             exact: bool = False, embedx_rows: int = 0) -> None:  # fmt: skip
        """Make room for ``rows`` new rows, ``pending`` new pending keys and (split tables)
        ``embedx_rows`` new embedx parts, or raise ResourceError with the table unchanged
        (an index may have been rehashed larger)."""
        index = self.index
        store = self.matrix if self.tier is None else self.tier
        needed = index.high_water + max(0, rows - index.free_ids)
        p_index, p_store = self.pending_index, self.pending_matrix
        p_needed = p_index.high_water + max(0, pending - p_index.free_ids)
        try:
            if self.tier is None:
                before = self.matrix.capacity
                self.matrix.grow_to(needed, exact=exact)
                if self.matrix.capacity != before:  # a growth: its pages are not touched yet
                    advise_huge_pages(self.matrix.array)
            else:  # the per-id maps (disk space was reserved by the op's begin)
                self.tier.grow_to(needed, op, exact=exact)
            if self.embedx is not None:  # a key and an xid per row the matrix holds
                held = max(needed, self.matrix.capacity)
                index.reserve_rows(held)  # type: ignore[union-attr]
                self.embedx.grow_ids(held, exact=True)
                self.embedx.reserve(embedx_rows, op)
            index.reserve(max(rows, 0))
            p_index.reserve(pending, erasing=pending_erases)
            p_store.grow_to(p_needed)
        except ResourceError:
            raise
        except MemoryError as exc:
            wanted = (
                index.bytes_to_reserve(max(rows, 0)) + store.bytes_to_hold(needed, exact=exact)
                + p_index.bytes_to_reserve(pending) + p_store.bytes_to_hold(p_needed)
                + (0 if self.embedx is None else self.embedx.bytes_to_reserve(needed, embedx_rows))
            )  # fmt: skip
            raise ResourceError(
                f"{op} to table {self.config.name!r}: out of memory making room for {rows} new "
                f"row(s) and {pending} new pending key(s): needed {wanted} more bytes on top of "
                f"the table's {self.nbytes}; the push was rejected and the table is unchanged "
                f"({exc})"
            ) from exc
