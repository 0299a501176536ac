"""A plain DNN: pooled embeddings of every slot and the dense features into an MLP."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..optim import Rule
from ..worker.nn import SparseModel
from ._blocks import mlp, slot_embedding

__all__ = ["DNN", "DNNHead"]


class DNNHead(nn.Module):
    """``(dense [B, D], emb [B, S, d]) -> logits [B, 1]``."""

    def __init__(self, num_slots: int, num_dense: int, emb_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.mlp = mlp(num_slots * emb_dim + num_dense, hidden)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([emb.flatten(1), dense], dim=1))


class DNN(SparseModel):
    """An MLP over concatenated slot embeddings and dense features."""

    def __init__(
        self,
        slots: Sequence[str],
        num_dense: int,
        *,
        emb_dim: int = 8,
        hidden: Sequence[int] = (400, 400, 400),
        rule: Rule | None = None,
        table: str = "emb",
    ) -> None:
        super().__init__()
        slots = tuple(slots)
        self.embeddings = nn.ModuleList([slot_embedding(table, emb_dim, slots, rule)])
        self.head = DNNHead(len(slots), num_dense, emb_dim, hidden)
