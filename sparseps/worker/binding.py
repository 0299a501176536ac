"""Which rows each table needs for a batch, and how modules sharing a table share them.

Several :class:`~sparseps.worker.nn.SparseEmbedding` modules may read one table, over the
same or different slots (e.g. a user-id table read by a "user" slot and a "friends"
slot). Per batch and table the trainer then needs *one* dedup over the union of those
modules' slots, one pull, one ``[U, dim]`` leaf tensor that every module of the table is
bound to (each through its own slice of the dedup, see
:meth:`~sparseps.core.lookup.SlotLookup.select`), and one push of that tensor's
gradient: autograd adds the modules' contributions per key, so the push carries the
merged gradient.

Tables whose modules read the same slot union (wide&deep's two tables read every slot)
share the dedup as well.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.lookup import SlotLookup, build_lookup
from ..errors import ConfigError
from .nn import SparseEmbedding

__all__ = ["TableBinder"]


class TableBinder:
    """The tables of a model's embeddings and the per-batch bookkeeping over them.

    Args:
        embeddings: every ``SparseEmbedding`` of the model (in module order).

    Raises:
        ConfigError: two modules declare the same table with different configs (dim,
            rule, initializer, lifecycle or seed): one table has one row layout and rule.
    """

    def __init__(self, embeddings: list[SparseEmbedding]) -> None:
        self.embeddings = list(embeddings)
        self.by_table: dict[str, list[SparseEmbedding]] = {}
        for emb in self.embeddings:
            modules = self.by_table.setdefault(emb.table, [])
            if modules and modules[0].config != emb.config:
                raise ConfigError(
                    f"table {emb.table!r} is declared twice with different configs: "
                    f"{modules[0].config} vs {emb.config}; give every SparseEmbedding of one "
                    "table the same dim, rule, initializer, lifecycle and seed, or another name"
                )
            modules.append(emb)
        self.tables = {name: modules[0].config for name, modules in self.by_table.items()}

    def lookups(self, batch) -> dict[str, SlotLookup]:
        """``{table: lookup over the union of its modules' slots}`` (one dedup per union)."""
        by_slots: dict[tuple[str, ...], SlotLookup] = {}
        out = {}
        for table, modules in self.by_table.items():
            union = tuple(dict.fromkeys(s for m in modules for s in m.slot_names(batch)))
            if union not in by_slots:
                by_slots[union] = build_lookup(batch, union)
            out[table] = by_slots[union]
        return out

    def bind(self, batch, lookups: dict, rows: dict, *, grad: bool) -> dict[str, torch.Tensor]:
        """Bind every module to its table's rows; returns ``{table: leaf tensor}``."""
        leaves = {}
        for table, modules in self.by_table.items():
            # a private copy: the pulled array may be a cached/shared buffer, and autograd
            # needs a leaf of its own whose .grad is the table's merged gradient
            # (gpups hands a fresh device tensor of its own: the leaf itself)
            given = rows[table]
            if isinstance(given, torch.Tensor):
                leaf = given
            else:
                leaf = torch.from_numpy(np.array(given, np.float32, copy=True))
            leaves[table] = leaf
            lookup = lookups[table]
            for module in modules:
                module.bind(lookup.select(module.slot_names(batch)), leaf, grad=grad)
        return leaves

    def grads(self, lookups: dict, leaves: dict) -> list:
        """``[(table, keys, grad [U, dim], shows, clicks)]`` after ``backward``."""
        out = []
        for table, lookup in lookups.items():
            grad = leaves[table].grad
            config = self.tables[table]
            dim = config.dim
            if grad is None:
                grad = np.zeros((lookup.keys.size, dim), np.float32)
            else:  # a table that pulls show/click (cvm) pushes only its embedding's gradient
                grad = grad.numpy()[:, config.pull_dim - dim :]
            out.append(
                (table, lookup.keys, np.ascontiguousarray(grad, np.float32), lookup.shows,
                 lookup.clicks)
            )  # fmt: skip
        return out

    def empty_grads(self) -> list:
        """A step's contribution of a worker with no data (sync mode keeps stepping)."""
        zeros = np.zeros(0, np.float32)
        return [
            (t, np.empty(0, np.uint64), np.zeros((0, c.dim), np.float32), zeros, zeros)
            for t, c in self.tables.items()
        ]

    def unbind(self) -> None:
        for emb in self.embeddings:
            emb.unbind()
