"""Small building blocks shared by the built-in models."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .. import optim
from ..config import Initializer, Lifecycle
from ..worker.nn import SparseEmbedding

__all__ = ["mlp", "slot_embedding"]


def mlp(in_features: int, hidden: Sequence[int], out_features: int = 1) -> nn.Sequential:
    """``Linear -> ReLU`` for each hidden width, then a final ``Linear``."""
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


def slot_embedding(
    table: str,
    dim: int,
    slots: Sequence[str],
    rule=None,
    *,
    zeros: bool = False,
    lifecycle: Lifecycle | None = None,
) -> SparseEmbedding:
    """The built-in models' sum-pooled embedding of every slot: Adam(0.01) unless ``rule``
    is given; rows start uniform in [-0.05, 0.05], or at zero (``zeros``, for linear parts)."""
    return SparseEmbedding(
        table,
        dim,
        slots=tuple(slots),
        rule=rule or optim.Adam(lr=0.01),
        initializer=Initializer.zeros() if zeros else Initializer.uniform(-0.05, 0.05),
        lifecycle=lifecycle,
    )
