"""PyTorch modules whose embedding rows live on the parameter servers.

A :class:`SparseEmbedding` declares a server table (name, dim, optimizer rule, initializer,
lifecycle) and, in ``forward``, pools the rows of the ids of its slots. The rows are not
stored in the module: before each step the trainer (or the predictor) *binds* the module
to the batch — the unique keys of the batch and a ``[U, dim]`` leaf tensor holding their
pulled rows. ``forward`` then pools that tensor's rows per bag
(:func:`sparseps.core.pooling.pool_bags`), and after ``backward`` the tensor's ``.grad``
is exactly the merged per-key gradient to push.

A :class:`SparseModel` splits a model into its sparse embeddings and a dense ``head``
taking ``(dense, *pooled)``; the head alone is what an inference model exports.

CVM (Paddle's ``continuous_value_model`` op): a table whose ``accessor.cvm`` is set pulls
each key's show and click in front of its embedding (``[U, 2 + dim]``, one request). A
module with ``cvm=True`` pools them with the embedding and gives the model, per slot,
``log(show + 1)`` and ``log(click + 1) - log(show + 1)`` of the pooled counts in front of
the pooled embedding (``output_dim = dim + 2``); the counts are inputs, not weights (no
gradient flows to them). A module with ``cvm=False`` over such a table drops them
(Paddle's ``use_cvm=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..config import Accessor, Initializer, Lifecycle, TableConfig
from ..core.lookup import SlotLookup
from ..core.pooling import pool_bags, slot_outputs
from ..errors import ConfigError, InputError

if TYPE_CHECKING:
    from ..data.schema import Batch
    from ..optim.base import Rule

__all__ = ["POOLINGS", "SparseEmbedding", "SparseModel", "dense_tensor"]

POOLINGS = ("sum", "mean", None)


class SparseEmbedding(nn.Module):
    """Embeddings of uint64 ids held by the servers, pooled per (sample, slot).

    Args:
        table: server table name. One table may serve many slots, and several modules
            (over the same or different slots; they must declare the same config): the
            trainer pulls and pushes it once per batch, see :mod:`sparseps.worker.binding`.
        dim: embedding width.
        slots: the slot names this module reads, in output order; None = every slot of
            the batch, in the batch's order.
        pooling: ``"sum"`` or ``"mean"`` -> ``forward`` returns ``[B, S, dim]``;
            None -> ``(rows [nnz, dim], bag_offsets [S*B])`` unpooled, slot-major.
        rule: the server-side optimizer rule (``sparseps.optim.*``); default Adagrad.
        initializer: deterministic per-key initializer; default uniform(-0.01, 0.01).
        lifecycle: admission / decay / shrink policy; default admit everything.
        seed: table seed for the initial values.
        memory_rows: rows each server keeps in memory, the rest on its disk (the servers
            need a disk dir); None: every row in memory (see TableConfig).
        cvm: give the model each slot's pooled show/click features in front of its
            embedding (see the module docstring); the table then pulls the counts.
        accessor: the table's :class:`~sparseps.config.Accessor` (Paddle's CTR accessor:
            embed/embedx parts, ``embedx_threshold``, save thresholds, per-slot dims).
    """

    def __init__(
        self,
        table: str,
        dim: int,
        *,
        slots: Sequence[str] | None = None,
        pooling: str | None = "sum",
        rule: Rule | None = None,
        initializer: Initializer | None = None,
        lifecycle: Lifecycle | None = None,
        seed: int = 0,
        memory_rows: int | None = None,
        cvm: bool = False,
        accessor: Accessor | None = None,
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigError(
                f"SparseEmbedding.pooling: expected one of {POOLINGS}, got {pooling!r}"
            )
        kwargs: dict[str, Any] = {"name": table, "dim": dim, "seed": seed}
        if rule is not None:
            kwargs["rule"] = rule
        if initializer is not None:
            kwargs["initializer"] = initializer
        if lifecycle is not None:
            kwargs["lifecycle"] = lifecycle
        if memory_rows is not None:
            kwargs["memory_rows"] = memory_rows
        accessor = accessor or Accessor()
        if cvm and not accessor.cvm:
            accessor = replace(accessor, cvm=True)
        kwargs["accessor"] = accessor
        self.config = TableConfig(**kwargs)
        self.cvm = bool(cvm)
        self.slots = tuple(slots) if slots is not None else None
        self.pooling = pooling
        self._lookup: SlotLookup | None = None
        self._rows: torch.Tensor | None = None
        self._output: torch.Tensor | None = None

    @property
    def table(self) -> str:
        return self.config.name

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def output_dim(self) -> int:
        """Columns per slot of ``forward``'s output: ``dim``, plus 2 with ``cvm``."""
        return self.config.dim + 2 * self.cvm

    def slot_names(self, batch: Batch) -> tuple[str, ...]:
        return self.slots if self.slots is not None else tuple(batch.slots)

    def bind(self, lookup: SlotLookup, rows: np.ndarray | torch.Tensor, *, grad: bool) -> None:
        """Attach the pulled rows of ``lookup.keys`` for the next forward pass."""
        tensor = torch.from_numpy(rows) if isinstance(rows, np.ndarray) else rows
        width = self.config.pull_dim
        if tensor.shape != (lookup.keys.size, width):
            raise InputError(
                f"table {self.table!r}: bound rows have shape {tuple(tensor.shape)}, "
                f"expected ({lookup.keys.size}, {width})"
            )
        self._lookup = lookup
        self._rows = tensor.requires_grad_(grad)

    def bind_output(self, output: torch.Tensor) -> None:
        """Make ``forward`` return ``output``, computed elsewhere: a heter worker runs the
        dense network on the pooled outputs its trainers computed (sparseps.worker.heter_service)."""
        self._output = output

    def unbind(self) -> None:
        self._lookup = None
        self._rows = None
        self._output = None

    @property
    def rows(self) -> torch.Tensor | None:
        """The bound ``[U, dim]`` leaf tensor (its ``.grad`` is the per-key gradient)."""
        return self._rows

    @property
    def lookup(self) -> SlotLookup | None:
        return self._lookup

    def forward(
        self, batch: Batch | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self._output is not None:
            return self._output
        lookup, rows = self._lookup, self._rows
        if lookup is None or rows is None:
            raise InputError(
                f"SparseEmbedding {self.table!r} has no rows bound: run the model through "
                "sparseps.Trainer or sparseps.Predictor, which pull the rows of each batch"
            )
        if self.pooling is None:  # the rows as pulled (with the table's counts, if any)
            return rows[torch.from_numpy(lookup.index)], torch.from_numpy(lookup.bag_offsets)
        pooled = pool_bags(rows, lookup, self.pooling)
        return slot_outputs(pooled, lookup.num_slots, self.config.accessor, cvm=self.cvm,
                            slots=lookup.slots)  # fmt: skip

    def extra_repr(self) -> str:
        cvm = ", cvm=True" if self.cvm else ""
        return f"table={self.table!r}, dim={self.dim}, pooling={self.pooling!r}{cvm}"


def dense_tensor(batch: Batch) -> torch.Tensor:
    """The batch's dense features as a float32 tensor sharing memory with the batch."""
    return torch.from_numpy(np.ascontiguousarray(batch.dense, dtype=np.float32))


class SparseModel(nn.Module):
    """A model = sparse embeddings + a dense ``head(dense, *pooled) -> logits``.

    Subclasses set ``self.embeddings`` (an ``nn.ModuleList`` of :class:`SparseEmbedding`)
    and ``self.head``. ``forward(batch)`` returns logits ``[B]``. The head sees only
    tensors, so it can be exported (``torch.export``) and run without servers.
    """

    embeddings: nn.ModuleList
    head: nn.Module

    def forward(self, batch: Batch) -> torch.Tensor:
        pooled = [emb(batch) for emb in self.embeddings]
        # the dense features go where the head is (a heter worker may run it on a GPU)
        device = next((p.device for p in self.head.parameters()), torch.device("cpu"))
        return self.head(dense_tensor(batch).to(device), *pooled).reshape(-1)
