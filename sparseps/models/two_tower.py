"""Two-tower retrieval: a user tower and an item tower over sparse slots, one score each pair.

::

    user slots ─ SparseEmbedding("tt_user") ─ sum-pool ─ MLP ─ L2-normalise ─ u  [B, out_dim]
    item slots ─ SparseEmbedding("tt_item") ─ sum-pool ─ MLP ─ L2-normalise ─ v  [B, out_dim]
    score(u, v) = <u, v> / temperature

Training rows are (user, item) pairs the user engaged with (label 1; rows with label 0
are not queries of the in-batch loss). :class:`InBatchSoftmax` treats the other items of
the batch as negatives (softmax over the ``[B, B]`` score matrix, the diagonal being the
positives). In-batch negatives are a sample of items drawn by popularity, so
``log_q=True`` applies the sampled-softmax correction (subtract each item's log
frequency in the batch), which removes that popularity bias.

``named_outputs(batch)`` gives ``user_vec``, ``item_vec`` (``[B, out_dim]``) and
``logit`` — what ``trainer.predict_from_dataset(..., outputs=("item_vec",))`` dumps for
an index (see docs/recall.md and ``sparseps build-index``). ``forward(batch)`` is the
pair's logit ``[B]``, so metrics (AUC of pairs against their labels) and the default
BCE loss also work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.schema import Batch
from ..optim import Rule
from ..worker.losses import Loss, LossOutput
from ..worker.nn import SparseEmbedding
from ._blocks import mlp

__all__ = ["InBatchSoftmax", "TwoTower"]


class TwoTower(nn.Module):
    """User and item towers over sparse slots (see the module docstring).

    Args:
        user_slots, item_slots: the slot names each tower reads (disjoint).
        emb_dim: embedding width of both tables.
        hidden: MLP widths of each tower.
        out_dim: width of the user and item vectors.
        temperature: the score's divisor (small: sharper softmax).
        rule: server optimizer rule of both tables (default Adagrad(lr=0.05)).
        seed: table seed (initial values).
    """

    def __init__(self, user_slots: Sequence[str], item_slots: Sequence[str], *, emb_dim: int = 16,
                 hidden: Sequence[int] = (64,), out_dim: int = 16, temperature: float = 0.05,
                 rule: Rule | None = None, seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        if set(user_slots) & set(item_slots):
            from ..errors import ConfigError

            raise ConfigError(
                f"TwoTower: user_slots and item_slots overlap: {sorted(set(user_slots) & set(item_slots))}"
            )
        if rule is None:
            from ..optim import Adagrad

            rule = Adagrad(lr=0.05)
        self.user_slots, self.item_slots = tuple(user_slots), tuple(item_slots)
        self.temperature = float(temperature)
        self.user_emb = SparseEmbedding(
            "tt_user", emb_dim, slots=self.user_slots, rule=rule, seed=seed
        )
        self.item_emb = SparseEmbedding(
            "tt_item", emb_dim, slots=self.item_slots, rule=rule, seed=seed
        )
        self.user_tower = mlp(emb_dim * len(self.user_slots), hidden, out_dim)
        self.item_tower = mlp(emb_dim * len(self.item_slots), hidden, out_dim)

    def user_vectors(self, batch: Batch) -> torch.Tensor:
        return F.normalize(self.user_tower(self.user_emb(batch).flatten(1)), dim=1)

    def item_vectors(self, batch: Batch) -> torch.Tensor:
        return F.normalize(self.item_tower(self.item_emb(batch).flatten(1)), dim=1)

    def named_outputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        u, v = self.user_vectors(batch), self.item_vectors(batch)
        return {"user_vec": u, "item_vec": v, "logit": (u * v).sum(1) / self.temperature}

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.named_outputs(batch)["logit"]


class InBatchSoftmax(Loss):
    """Softmax over in-batch items: row i's positive is item i, the others negatives.

    Only rows with label 1 are queries (a 0 row still serves as a negative item). Items
    that repeat in a batch (the same first id of ``item_key``) are not counted as
    negatives of each other's rows. ``log_q``: subtract log(batch frequency of the item)
    from its logits (popular items are otherwise over-penalised as negatives).

    Metrics: the diagonal score's sigmoid against the label (one task).
    """

    tasks = ("",)

    def __init__(self, item_key: str | None = None, *, log_q: bool = False) -> None:
        self.item_key = item_key
        self.log_q = log_q

    def __call__(self, model: TwoTower, batch: Batch) -> LossOutput:
        out = model.named_outputs(batch)
        u, v = out["user_vec"], out["item_vec"]
        scores = u @ v.T / model.temperature
        size = scores.shape[0]
        if self.item_key is not None and size:
            from ..worker.reporting import group_ids

            items = group_ids(batch, self.item_key)
            _, inverse, counts = np.unique(items, return_inverse=True, return_counts=True)
            same = torch.from_numpy(inverse[:, None] == inverse[None, :])
            same.fill_diagonal_(False)
            scores = scores.masked_fill(same, float("-inf"))
            if self.log_q:
                log_q = torch.from_numpy(np.log(counts[inverse] / size).astype(np.float32))
                scores = scores - log_q[None, :]
        labels = np.asarray(batch.label, np.float32)
        positive = torch.from_numpy(labels > 0.5)
        target = torch.arange(size)
        per_row = F.cross_entropy(scores, target, reduction="none") if size else scores.sum(1)
        loss = (per_row * positive).sum()
        preds = torch.sigmoid(out["logit"].detach()).numpy().astype(np.float32)
        return LossOutput(loss, preds.reshape(-1, 1), labels.reshape(-1, 1))
