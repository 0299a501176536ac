"""A model builder and a loss for the online tests' ``model.builder`` / ``model.loss``."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import sparseps as sps
from sparseps.models import DNN
from sparseps.worker.losses import Loss, LossOutput, label_column


def dnn(schema, emb_dim=4, hidden=(8,)):
    return DNN(schema.slots, len(schema.dense), emb_dim=emb_dim, hidden=tuple(hidden))


def weighted_bce(logits, batch):
    labels = torch.from_numpy(batch.label)
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="none") * (1 + labels)


class _Heads(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 2)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.cat([emb.flatten(1), dense], 1))


class TwoHeads(sps.nn.SparseModel):
    """Shared embeddings of the schema's slots and its dense columns; two logits ``[B, 2]``
    (a SparseModel, so the online job's inference saves take it)."""

    def __init__(self, schema, emb_dim: int) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList([sps.nn.SparseEmbedding(
            "two_heads", emb_dim, slots=schema.slots, rule=sps.optim.Adagrad(lr=0.1))])  # fmt: skip
        self.head = _Heads(emb_dim * len(schema.slots) + len(schema.dense))

    def forward(self, batch) -> torch.Tensor:
        return self.head(sps.nn.dense_tensor(batch), self.embeddings[0](batch))


def two_heads(schema, emb_dim=4):
    return TwoHeads(schema, emb_dim)


class ConversionThenClick(Loss):
    """A two-task loss whose *first* task is the extra label ``conversion`` (so the online
    ledger's metrics, those of the first task, count conversions), the second the click."""

    tasks = ("conversion", "click")

    def __call__(self, model, batch):
        logits = model(batch)
        labels = np.stack([label_column(batch, 1), label_column(batch, 0)], 1)
        target = torch.from_numpy(labels)
        loss = F.binary_cross_entropy_with_logits(logits, target, reduction="sum")
        preds = torch.sigmoid(logits).detach().numpy().astype(np.float32)
        return LossOutput(loss, preds, labels)


def broken(schema, **params):
    """A builder that fails as a bug would (not a SparsePSError): test_online_ledger.py."""
    raise RuntimeError("this model cannot be built (a test's broken builder)")
