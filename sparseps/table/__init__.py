"""Server-side storage: sparse tables (hash index + row matrix) and dense tables.

``SparseTable(config)`` holds one shard of a sparse embedding table: pull / push /
push_delta, admission, decay, shrink, export / import. ``DenseTable`` holds a flat
vector. ``RowLayout`` names the columns of a stored row; ``TableStats`` is a size
snapshot. See docs/table.md.
"""

from __future__ import annotations

from .dense import DenseTable
from .hashmap import KeyIndex
from .layout import RowLayout
from .sparse import SparseTable, TableStats

__all__ = ["DenseTable", "KeyIndex", "RowLayout", "SparseTable", "TableStats"]
