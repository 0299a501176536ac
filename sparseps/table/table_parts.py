"""What the parts of :class:`~sparseps.table.SparseTable` use of each other, declared once.

SparseTable is assembled from mixins (``restore.TableFiles``, ``full_rows.FullRows``,
``lifecycle_ops.LifecycleOps``) that read the storage ``sparse.py`` sets up: the key
indexes, the row matrices or the tier, the row layout. Every mixin derives from
:class:`TableParts`, which declares those names for the type checker only: at run time
it is an empty class, and SparseTable's own definitions are the ones that run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from ..config import Lifecycle, TableConfig
    from .growth import Allocator, GrowableMatrix
    from .hashmap import KeyIndex
    from .layout import RowLayout
    from .tier import RowTier

__all__ = ["TableParts"]


class TableParts:
    """The names the SparseTable mixins share (declarations only; module docstring)."""

    if TYPE_CHECKING:

        def __init__(self, config: TableConfig, *, allocator: Allocator | None = None,
                     disk_dir: str | None = None) -> None: ...  # fmt: skip

        # the config and what follows from it
        config: TableConfig
        layout: RowLayout
        _dim: int
        _stat0: int  # first statistics column of a stored row
        _where: dict[str, int]  # first storage column of each exported field
        _policy: Lifecycle
        _always: bool  # admission "always"
        _state0: np.ndarray  # the rule's initial state of a row
        _allocator: Allocator | None
        _disk_dir: str | None
        # the storage: live rows (in memory or in the tier) and pending keys' counters
        _index: KeyIndex
        _store: GrowableMatrix
        _tier: RowTier | None
        _pending_index: KeyIndex
        _pending_store: GrowableMatrix

        @property
        def _rows(self) -> np.ndarray: ...
        @property
        def _pending(self) -> np.ndarray: ...
        def _grow(self, op: str, rows: int, pending: int, *, pending_erases: int = 0,
                  exact: bool = False) -> None: ...  # fmt: skip
