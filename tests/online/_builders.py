"""A model builder and a loss for the online tests' ``model.builder`` / ``model.loss``."""

import torch.nn.functional as F

from sparseps.models import DNN


def dnn(schema, emb_dim=4, hidden=(8,)):
    return DNN(schema.slots, len(schema.dense), emb_dim=emb_dim, hidden=tuple(hidden))


def weighted_bce(logits, batch):
    import torch

    labels = torch.from_numpy(batch.label)
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="none") * (1 + labels)
