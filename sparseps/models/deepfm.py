"""DeepFM (Guo et al., 2017): first-order weights + factorization machine + DNN."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..optim import Rule
from ..worker.nn import SparseModel
from ._blocks import CvmNorm, ctr_accessor, mlp, slot_embedding

__all__ = ["DeepFM", "DeepFMHead"]


class DeepFMHead(nn.Module):
    """``(dense [B, D], emb [B, S, d], first [B, S, 1]) -> logits [B, 1]``.

    The FM term is ``0.5 * sum_k((sum_i v_ik)^2 - sum_i v_ik^2)`` over the slot embeddings.
    """

    def __init__(self, num_slots: int, num_dense: int, emb_dim: int, hidden: Sequence[int],
                 fm_from: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.fm_from = fm_from  # the FM term skips the cvm features
        self.flat = CvmNorm(num_slots, cvm=fm_from == 2)
        self.dnn = mlp(num_slots * emb_dim + num_dense, hidden)
        self.dense_linear = nn.Linear(num_dense, 1)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        factors = emb[:, :, self.fm_from :]
        square_of_sum = factors.sum(dim=1).pow(2)
        sum_of_square = factors.pow(2).sum(dim=1)
        fm = 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)
        deep = self.dnn(torch.cat([self.flat(emb), dense], dim=1))
        return first.sum(dim=1) + self.dense_linear(dense) + fm + deep


class DeepFM(SparseModel):
    """DeepFM over ``slots``: a dim-1 first-order table and a dim-``d`` FM/DNN table
    (``cvm``: its pooled show/click features go to the DNN; ``embedx_threshold``: the FM
    table is a CTR-accessor table, see :class:`~sparseps.models.DNN`)."""

    def __init__(
        self,
        slots: Sequence[str],
        num_dense: int,
        *,
        emb_dim: int = 8,
        hidden: Sequence[int] = (400, 400, 400),
        rule: Rule | None = None,
        first_rule: Rule | None = None,
        table: str = "fm_emb",
        first_table: str = "fm_first",
        cvm: bool = False,
        embedx_threshold: float | None = None,
        embedx_dtype: str = "float32",
    ) -> None:
        super().__init__()
        slots = tuple(slots)
        accessor = ctr_accessor(embedx_threshold, embedx_dtype, rule)
        dim = emb_dim + (accessor is not None)
        emb = slot_embedding(table, dim, slots, rule, cvm=cvm, accessor=accessor)
        self.embeddings = nn.ModuleList(
            [emb, slot_embedding(first_table, 1, slots, first_rule, zeros=True)]
        )
        self.head = DeepFMHead(len(slots), num_dense, emb.output_dim, hidden, fm_from=2 * cvm)
