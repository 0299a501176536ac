"""A plain DNN: pooled embeddings of every slot and the dense features into an MLP."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..optim import Rule
from ..worker.nn import SparseModel
from ._blocks import CvmNorm, ctr_accessor, mlp, slot_embedding

__all__ = ["DNN", "DNNHead"]


class DNNHead(nn.Module):
    """``(dense [B, D], emb [B, S, d]) -> logits [B, 1]``."""

    def __init__(self, num_slots: int, num_dense: int, emb_dim: int, hidden: Sequence[int],
                 *, cvm: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.flat = CvmNorm(num_slots, cvm=cvm)
        self.mlp = mlp(num_slots * emb_dim + num_dense, hidden)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.flat(emb), dense], dim=1))


class DNN(SparseModel):
    """An MLP over concatenated slot embeddings and dense features.

    ``cvm``: each slot's pooled show/click features go in too; ``embedx_threshold``: the
    table is a CTR-accessor table (an embed weight per feature, the ``emb_dim`` embedx part
    stored once its score reaches the threshold; :class:`~sparseps.config.Accessor`).
    """

    def __init__(
        self,
        slots: Sequence[str],
        num_dense: int,
        *,
        emb_dim: int = 8,
        hidden: Sequence[int] = (400, 400, 400),
        rule: Rule | None = None,
        table: str = "emb",
        cvm: bool = False,
        embedx_threshold: float | None = None,
        embedx_dtype: str = "float32",
    ) -> None:
        super().__init__()
        slots = tuple(slots)
        accessor = ctr_accessor(embedx_threshold, embedx_dtype, rule)
        dim = emb_dim + (accessor is not None)
        emb = slot_embedding(table, dim, slots, rule, cvm=cvm, accessor=accessor)
        self.embeddings = nn.ModuleList([emb])
        self.head = DNNHead(len(slots), num_dense, emb.output_dim, hidden, cvm=cvm)
