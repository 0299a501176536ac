"""``sparseps.Predictor``: predictions from an inference model, without servers.

Loads the chain of saves (newest complete base, then its deltas in order; see
:mod:`sparseps.checkpoint.inference`), verifies every manifest, keeps each table as a
sorted key array plus an embedding matrix (lookups are one ``searchsorted``), and runs
the TorchScript head of the last save. A key the model does not hold gets what a pull
of an unknown key gives during training: its deterministic initial value when the
table admits every key, zeros otherwise — so predictions match the trainer's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from ..config import TableConfig
from ..core.lookup import SlotLookup, build_lookup
from ..files import manifest as mf
from ..files import shards
from ..table.initializers import initial_values
from . import inference

if TYPE_CHECKING:
    from ..data.schema import Batch

__all__ = ["EmbeddingTable", "Predictor"]

log = logging.getLogger(__name__)


@dataclass
class EmbeddingTable:
    """One table of an inference model: sorted keys, their rows, and the fallback rule."""

    config: TableConfig
    keys: np.ndarray  # uint64 [n], sorted, unique
    rows: np.ndarray  # float32 [n, dim]

    def upsert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Newer rows win (a delta over a base)."""
        all_keys = np.concatenate([keys, self.keys])  # new first: np.unique keeps the first
        all_rows = np.concatenate([rows, self.rows])
        self.keys, first = np.unique(all_keys, return_index=True)
        self.rows = np.ascontiguousarray(all_rows[first])

    def delete(self, keys: np.ndarray) -> None:
        keep = ~np.isin(self.keys, keys)
        self.keys, self.rows = self.keys[keep], self.rows[keep]

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys`` (any order); unknown keys get the training fallback."""
        position = np.searchsorted(self.keys, keys)
        position = np.minimum(position, max(self.keys.size - 1, 0))
        found = self.keys[position] == keys if self.keys.size else np.zeros(keys.size, bool)
        out = np.zeros((keys.size, self.config.dim), np.float32)
        out[found] = self.rows[position[found]]
        missing = ~found
        if missing.any() and self.config.lifecycle.admission == "always":
            config = self.config
            out[missing] = initial_values(
                keys[missing], config.dim, config.initializer, config.seed
            )
        return out


class Predictor:
    """Predict click probabilities from an inference model directory.

    Args:
        directory: the folder ``trainer.save_inference_model`` wrote into.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.saves = inference.chain(self.directory)
        self.tables: dict[str, EmbeddingTable] = {}
        for folder in self.saves:
            self._apply(folder, mf.verify(folder))
        self.head = torch.jit.load(str(self.saves[-1] / inference.HEAD_FILE))
        self.head.eval()

    def _apply(self, folder: Path, manifest: dict) -> None:
        self.embeddings = manifest["embeddings"]
        for name, entry in manifest["tables"].items():
            config = TableConfig.from_dict(entry["config"])
            table = self.tables.get(name)
            if manifest["kind"] == "base" or table is None:
                table = EmbeddingTable(
                    config, np.empty(0, np.uint64), np.zeros((0, config.dim), np.float32)
                )
                self.tables[name] = table
            # tombstones first: a key deleted by shrink and pushed again later is in the rows
            files = sorted(entry["files"], key=lambda name: not name.endswith(".tombstones.arrow"))
            for file_name in files:
                meta, columns = shards.read_shard(folder / file_name)
                if meta.get("kind") == "tombstones":
                    table.delete(columns["key"])
                else:
                    table.upsert(columns["key"], columns["embedding"].reshape(-1, config.dim))

    def predict_batch(self, batch: Batch) -> np.ndarray:
        """Probabilities ``[B]`` for one :class:`sparseps.data.Batch`."""
        pooled = []
        lookups: dict[tuple[str, ...], SlotLookup] = {}
        for spec in self.embeddings:
            slots = tuple(spec["slots"]) if spec["slots"] is not None else tuple(batch.slots)
            lookup = lookups.get(slots) or lookups.setdefault(slots, build_lookup(batch, slots))
            rows = torch.from_numpy(self.tables[spec["table"]].lookup(lookup.keys))
            index, offsets = torch.from_numpy(lookup.index), torch.from_numpy(lookup.bag_offsets)
            bags = F.embedding_bag(index, rows, offsets, mode=spec["pooling"] or "sum")
            pooled.append(bags.view(len(slots), len(batch), spec["dim"]).transpose(0, 1))
        dense = torch.from_numpy(np.ascontiguousarray(batch.dense, np.float32))
        with torch.no_grad():
            logits = self.head(dense, *pooled).reshape(-1)
        return torch.sigmoid(logits).numpy().astype(np.float32)

    def predict(self, dataset: Iterable[Batch]) -> np.ndarray:
        """Probabilities for every sample of an iterable of batches (a dataset)."""
        parts = [self.predict_batch(batch) for batch in dataset]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def rows(self) -> dict[str, int]:
        return {name: int(t.keys.size) for name, t in self.tables.items()}
