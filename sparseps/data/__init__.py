"""Data: schemas, columnar batches, parsers, datasets and the synthetic generator.

See docs/data.md for the formats (one worked example each), the hash of categorical
values, the bad-line policy and how files are split among workers.
"""

from __future__ import annotations

from .dataset import DatasetOptions
from .generator import DataGenerator, MultiSlotDataGenerator, MultiSlotStringDataGenerator
from .hashing import hash_string_array, slot_seed
from .memory_dataset import InMemoryDataset
from .queue_dataset import QueueDataset
from .schema import AVAZU, CRITEO, CRITEO_SLOT, Batch, DenseTransform, Schema, Slot
from .sources import Format, expand_files, shard
from .stats import MAX_BAD_RATIO, DatasetStats, PassStats

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
