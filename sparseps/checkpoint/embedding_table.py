"""One table of an inference model held in memory: sorted keys, their rows, and the
fallback rule for keys it does not hold (what a pull of an unknown key gives in training).
A base's rows are served from its files instead (:mod:`.mapped_table`), with the deltas'
rows in one of these over them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import TableConfig
from ..table.split_rows import missing_rows

__all__ = ["EmbeddingTable", "frozen"]


def frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class EmbeddingTable:
    """One table of an inference model: sorted keys, their rows, and the fallback rule.

    Immutable: :meth:`upsert` and :meth:`delete` return a new table.
    """

    config: TableConfig
    keys: np.ndarray  # uint64 [n], sorted, unique, read-only
    rows: np.ndarray  # float32 [n, dim], read-only

    @classmethod
    def empty(cls, config: TableConfig) -> EmbeddingTable:
        return cls(
            config,
            frozen(np.empty(0, np.uint64)),
            frozen(np.zeros((0, config.pull_dim), np.float32)),
        )

    @property
    def row_count(self) -> int:
        """How many keys it serves."""
        return int(self.keys.size)

    def upsert(self, keys: np.ndarray, rows: np.ndarray) -> EmbeddingTable:
        """This table with ``keys`` set to ``rows`` (a delta over a base: newer rows win;
        of a key repeated in ``keys``, the first). One merge, O(n + m log n)."""
        keys, first = np.unique(np.asarray(keys, np.uint64), return_index=True)
        rows = np.asarray(rows, np.float32)[first]
        position = np.searchsorted(self.keys, keys)
        hit = position < self.keys.size
        hit[hit] = self.keys[position[hit]] == keys[hit]
        merged = self.rows.copy()
        merged[position[hit]] = rows[hit]
        new = ~hit
        return EmbeddingTable(
            self.config,
            frozen(np.insert(self.keys, position[new], keys[new])),
            frozen(np.ascontiguousarray(np.insert(merged, position[new], rows[new], axis=0))),
        )

    def delete(self, keys: np.ndarray) -> EmbeddingTable:
        keep = ~np.isin(self.keys, keys)
        return EmbeddingTable(self.config, frozen(self.keys[keep]), frozen(self.rows[keep]))

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys`` (any order); unknown keys get the training fallback."""
        position = np.searchsorted(self.keys, keys)
        position = np.minimum(position, max(self.keys.size - 1, 0))
        found = self.keys[position] == keys if self.keys.size else np.zeros(keys.size, bool)
        out = np.zeros((keys.size, self.config.pull_dim), np.float32)
        out[found] = self.rows[position[found]]
        missing = ~found
        if missing.any():  # what a pull of a key that is not a row gives in training
            out[missing] = missing_rows(self.config, keys[missing])
        return out

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.rows.nbytes)
