"""Table configuration: frozen, validated dataclasses (DESIGN §2.5).

- :class:`TableConfig` (``table.py``): one sparse table: name, dim, rule, initializer,
  lifecycle, seed, memory budget, accessor;
- :class:`Initializer`, :class:`Lifecycle` (``values.py``): a row's first value; admission,
  decay and shrink;
- :class:`Accessor` (``accessor.py``): the parts of a row (Paddle's CTR accessor: an embed
  part for every row, an embedx part once a row's score earns it); :func:`ctr_table`
  (``ctr.py``) builds a config from Paddle's field names.

The field validators live in :mod:`sparseps.core.validate` (shared with the optimizer
rules); ``check_float`` and ``check_int`` are re-exported here for existing callers.
"""

from __future__ import annotations

from ..core.validate import check_float, check_int
from .accessor import Accessor, EmbedxDtype
from .ctr import ctr_table
from .table import MAX_DIM, TableConfig
from .values import Admission, Initializer, InitKind, Lifecycle

__all__ = [
    "MAX_DIM",
    "Accessor",
    "Admission",
    "EmbedxDtype",
    "InitKind",
    "Initializer",
    "Lifecycle",
    "TableConfig",
    "check_float",
    "check_int",
    "ctr_table",
]
