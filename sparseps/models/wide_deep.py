"""Wide & Deep (Cheng et al., 2016), the model of the seed system's quick start.

wide: a dim-1 table over every slot (FTRL by default, the classic rule for the linear
part of CTR models) plus a linear layer on the dense features; deep: dim-``d`` embeddings
of every slot concatenated with the dense features into an MLP. logit = wide + deep.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .. import optim
from ..config import Lifecycle
from ..optim import Rule
from ..worker.nn import SparseModel
from ._blocks import mlp, slot_embedding

__all__ = ["WideDeep", "WideDeepHead"]


class WideDeepHead(nn.Module):
    """The dense part: ``(dense [B, D], deep [B, S, d], wide [B, S, 1]) -> logits [B, 1]``."""

    def __init__(self, num_slots: int, num_dense: int, emb_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.deep = mlp(num_slots * emb_dim + num_dense, hidden)
        self.wide_dense = nn.Linear(num_dense, 1)
        # a constant added to every logit, set after training by a calibration step (see
        # sparseps.models.calibration); a buffer, not a parameter: it is not trained and
        # not in the dense table, but it is exported with the head
        self.register_buffer("logit_shift", torch.zeros(1))

    def forward(self, dense: torch.Tensor, deep: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
        x = torch.cat([deep.flatten(1), dense], dim=1)
        return self.deep(x) + self.wide_dense(dense) + wide.sum(dim=1) + self.logit_shift


class WideDeep(SparseModel):
    """Wide & Deep over ``slots`` with ``num_dense`` dense features.

    Args:
        slots: the sparse slot names (e.g. ``sparseps.data.CRITEO.slots``).
        num_dense: number of dense features.
        emb_dim: width of the deep embeddings.
        hidden: MLP hidden widths (the seed system's default is 400-400-400).
        deep_rule / wide_rule: server-side rules of the two tables.
        lifecycle: admission / decay / shrink policy of both tables (default: admit all).
        memory_rows: rows of each table a server keeps in memory, the rest on its disk
            (``--disk-dir``; docs/table.md); None: every row in memory.
    """

    def __init__(
        self,
        slots: Sequence[str],
        num_dense: int,
        *,
        emb_dim: int = 8,
        hidden: Sequence[int] = (400, 400, 400),
        deep_rule: Rule | None = None,
        wide_rule: Rule | None = None,
        deep_table: str = "deep_emb",
        wide_table: str = "wide_emb",
        lifecycle: Lifecycle | None = None,
        memory_rows: int | None = None,
    ) -> None:
        super().__init__()
        slots = tuple(slots)
        # Defaults chosen for the worst click rate, not the best (issue 29, docs/training.md
        # "Defaults"; measured gains are test AUC at 0.5%-4% clicks):
        # - wide FTRL(alpha=0.05, beta=1, l1=0.05): gradients are of the batch-mean loss
        #   (~1/batch per sample), so with beta=1 a weight moves in proportion to its
        #   evidence; with beta=0 (the old default) the first step moved every id by about
        #   alpha whatever its gradient, and at low click rates most ids are seen a few times,
        #   only in negatives: that was fitting noise. l1 leaves ids without evidence at 0.
        #   Safe with any gradient (FTRL guards its denominator, issue 28).
        # - deep Adam(lr=0.01, eps=1e-4): Adam's first step is lr whatever the gradient's
        #   size, so a rare id in a single negative row moved by a full lr; eps=1e-4 scales
        #   down steps of gradients below ~1e-4 (the rare ids' at low click rates).
        wide_rule = wide_rule or optim.FTRL(alpha=0.05, beta=1.0, l1=0.05, l2=0.0)
        deep_rule = deep_rule or optim.Adam(lr=0.01, eps=1e-4)
        self.embeddings = nn.ModuleList(
            [
                slot_embedding(
                    deep_table,
                    emb_dim,
                    slots,
                    deep_rule,
                    lifecycle=lifecycle,
                    memory_rows=memory_rows,
                ),
                slot_embedding(
                    wide_table,
                    1,
                    slots,
                    wide_rule,
                    zeros=True,
                    lifecycle=lifecycle,
                    memory_rows=memory_rows,
                ),
            ]
        )
        self.head = WideDeepHead(len(slots), num_dense, emb_dim, hidden)
