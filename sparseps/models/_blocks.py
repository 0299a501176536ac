"""Small building blocks shared by the built-in models."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["mlp"]


def mlp(in_features: int, hidden: Sequence[int], out_features: int = 1) -> nn.Sequential:
    """``Linear -> ReLU`` for each hidden width, then a final ``Linear``."""
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)
