"""Wide & Deep (Cheng et al., 2016), the model of the seed system's quick start.

wide: a dim-1 table over every slot (FTRL by default, the classic rule for the linear
part of CTR models) plus a linear layer on the dense features; deep: dim-``d`` embeddings
of every slot concatenated with the dense features into an MLP. logit = wide + deep.

With ``embedx_threshold`` the model is Paddle's CTR accessor layout: one table whose
embed part (``embed_w``, under the wide rule) is the wide weight and whose embedx part
(``d`` wide, under the deep rule) is stored once a feature's show/click score reaches the
threshold (:class:`~sparseps.config.Accessor`); the MLP sees both. With ``cvm`` the deep
input of each slot also carries its pooled show/click features (Paddle's cvm op).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .. import optim
from ..config import Lifecycle
from ..optim import Rule
from ..worker.nn import SparseModel
from ._blocks import CvmNorm, ctr_accessor, mlp, slot_embedding

__all__ = ["CtrWideDeepHead", "WideDeep", "WideDeepHead"]


class WideDeepHead(nn.Module):
    """The dense part: ``(dense [B, D], deep [B, S, d], wide [B, S, 1]) -> logits [B, 1]``."""

    def __init__(self, num_slots: int, num_dense: int, emb_dim: int, hidden: Sequence[int],
                 *, cvm: bool = False, mlp_init: str = "torch") -> None:  # fmt: skip
        super().__init__()
        self.flat = CvmNorm(num_slots, cvm=cvm)
        self.deep = mlp(num_slots * emb_dim + num_dense, hidden, init=mlp_init)
        self.wide_dense = nn.Linear(num_dense, 1)
        if mlp_init == "glorot":
            nn.init.xavier_uniform_(self.wide_dense.weight)
            nn.init.zeros_(self.wide_dense.bias)
        # a constant added to every logit, set after training by a calibration step (see
        # sparseps.models.calibration); a buffer, not a parameter: it is not trained and
        # not in the dense table, but it is exported with the head
        self.register_buffer("logit_shift", torch.zeros(1))

    def forward(self, dense: torch.Tensor, deep: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.flat(deep), dense], dim=1)
        return self.deep(x) + self.wide_dense(dense) + wide.sum(dim=1) + self.logit_shift


class CtrWideDeepHead(nn.Module):
    """The dense part over one CTR-accessor table: ``(dense [B, D], emb [B, S, w]) ->
    logits [B, 1]``, the wide part being the sum of the slots' ``embed_w`` (column
    ``wide_column`` of ``emb``: after the cvm features, if any)."""

    def __init__(self, num_slots: int, num_dense: int, width: int, wide_column: int,
                 hidden: Sequence[int], *, mlp_init: str = "torch") -> None:  # fmt: skip
        super().__init__()
        self.wide_column = wide_column
        self.flat = CvmNorm(num_slots, cvm=wide_column == 2)  # cvm features in front
        self.deep = mlp(num_slots * width + num_dense, hidden, init=mlp_init)
        # the linear part starts at zero, as the features' embed_w do (FTRL): PyTorch's
        # default init of a Linear over raw dense values adds a random logit term (std ~0.8
        # on the demo's data) that the slow dense rule needs most of a pass to remove; with
        # cvm it kept the model from learning at all
        self.wide_dense = nn.Linear(num_dense, 1)
        nn.init.zeros_(self.wide_dense.weight)
        nn.init.zeros_(self.wide_dense.bias)
        self.register_buffer("logit_shift", torch.zeros(1))  # as WideDeepHead's

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        wide = emb[:, :, self.wide_column].sum(dim=1, keepdim=True)
        x = torch.cat([self.flat(emb), dense], dim=1)
        return self.deep(x) + self.wide_dense(dense) + wide + self.logit_shift


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
        cvm: the deep input of each slot carries its pooled show/click features.
        embedx_threshold: None (two tables), or one CTR-accessor table whose embedx part
            is stored once a feature's score reaches it (see the module docstring).
        embedx_dtype: ``"float32"`` or ``"float16"`` embedx weights (with a threshold;
            float16 takes ``SparseAdagrad`` as the deep rule unless one is given).
        mlp_init: the dense layers' initialisation, ``"torch"`` or ``"glorot"``
            (:func:`~sparseps.models._blocks.mlp`).
        emb_init: the deep rows start uniform in ``[-emb_init, emb_init]`` (0: at zero).
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
        cvm: bool = False,
        embedx_threshold: float | None = None,
        embedx_dtype: str = "float32",
        mlp_init: str = "torch",
        emb_init: float = 0.05,
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
        if deep_rule is None and embedx_dtype == "float16":
            deep_rule = optim.SparseAdagrad(lr=0.05, clip=None)
        deep_rule = deep_rule or optim.Adam(lr=0.01, eps=1e-4)
        accessor = ctr_accessor(embedx_threshold, embedx_dtype, wide_rule)
        if accessor is not None:  # one table: embed_w (the wide weight) + the embedx part
            table = slot_embedding(deep_table, 1 + emb_dim, slots, deep_rule,
                                   lifecycle=lifecycle, memory_rows=memory_rows, cvm=cvm,
                                   accessor=accessor, init_scale=emb_init)  # fmt: skip
            self.embeddings = nn.ModuleList([table])
            self.head = CtrWideDeepHead(len(slots), num_dense, table.output_dim, 2 * cvm, hidden,
                                        mlp_init=mlp_init)  # fmt: skip
            return
        deep = slot_embedding(deep_table, emb_dim, slots, deep_rule, lifecycle=lifecycle,
                              memory_rows=memory_rows, cvm=cvm, init_scale=emb_init)  # fmt: skip
        self.embeddings = nn.ModuleList(
            [
                deep,
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
        self.head = WideDeepHead(len(slots), num_dense, deep.output_dim, hidden, cvm=cvm,
                                 mlp_init=mlp_init)  # fmt: skip
