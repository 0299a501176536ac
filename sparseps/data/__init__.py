"""Data: schemas, columnar batches, parsers, datasets and the synthetic generator.

See docs/data.md for the formats (one worked example each), the hash of categorical
values, the bad-line policy and how files are split among workers.

Names are loaded on first use, as on :mod:`sparseps`: a Paddle reader script that
changed its import line to ``import sparseps.data as fleet`` runs once per file as a
``pipe_command``, and its ``fleet.MultiSlotDataGenerator`` then costs the generator
module alone, not the compiled parsers (numba) the datasets need.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:  # the names as the type checker sees them (loaded lazily below)
    from .dataset import DatasetOptions
    from .formats import Format
    from .generator import DataGenerator, MultiSlotDataGenerator, MultiSlotStringDataGenerator
    from .hashing import hash_string_array, slot_seed
    from .memory_dataset import InMemoryDataset
    from .queue_dataset import QueueDataset
    from .schema import AVAZU, CRITEO, CRITEO_SLOT, Batch, DenseTransform, Schema, Slot
    from .sources import expand_files, shard
    from .stats import MAX_BAD_RATIO, DatasetStats, PassStats

# public name -> the module that defines it
_LAZY = {
    "AVAZU": "schema",
    "CRITEO": "schema",
    "CRITEO_SLOT": "schema",
    "MAX_BAD_RATIO": "stats",
    "Batch": "schema",
    "DataGenerator": "generator",
    "DatasetOptions": "dataset",
    "DatasetStats": "stats",
    "DenseTransform": "schema",
    "Format": "formats",
    "InMemoryDataset": "memory_dataset",
    "MultiSlotDataGenerator": "generator",
    "MultiSlotStringDataGenerator": "generator",
    "PassStats": "stats",
    "QueueDataset": "queue_dataset",
    "Schema": "schema",
    "Slot": "schema",
    "expand_files": "sources",
    "hash_string_array": "hashing",
    "shard": "sources",
    "slot_seed": "hashing",
}

__all__ = [
    "AVAZU",
    "CRITEO",
    "CRITEO_SLOT",
    "MAX_BAD_RATIO",
    "Batch",
    "DataGenerator",
    "DatasetOptions",
    "DatasetStats",
    "DenseTransform",
    "Format",
    "InMemoryDataset",
    "MultiSlotDataGenerator",
    "MultiSlotStringDataGenerator",
    "PassStats",
    "QueueDataset",
    "Schema",
    "Slot",
    "expand_files",
    "hash_string_array",
    "shard",
    "slot_seed",
]


def __getattr__(name: str) -> _Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'sparseps.data' has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
