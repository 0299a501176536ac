"""Small building blocks shared by the built-in models."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .. import optim
from ..config import Initializer, Lifecycle
from ..worker.nn import SparseEmbedding

__all__ = ["mlp", "set_output_bias", "slot_embedding"]


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
    rule: optim.Rule | None = None,
    *,
    zeros: bool = False,
    lifecycle: Lifecycle | None = None,
    memory_rows: int | None = None,
) -> SparseEmbedding:
    """The built-in models' sum-pooled embedding of every slot: Adam(0.01) unless ``rule``
    is given; rows start uniform in [-0.05, 0.05], or at zero (``zeros``, for linear parts);
    ``memory_rows``: the table's memory budget per server (None: all rows in memory)."""
    return SparseEmbedding(
        table,
        dim,
        slots=tuple(slots),
        rule=rule or optim.Adam(lr=0.01),
        initializer=Initializer.zeros() if zeros else Initializer.uniform(-0.05, 0.05),
        lifecycle=lifecycle,
        memory_rows=memory_rows,
    )


def set_output_bias(model: nn.Module, click_rate: float) -> float:
    """Start the model's predictions at ``click_rate``: the bias of the head's last
    ``Linear`` (the one that makes the logit) becomes ``logit(click_rate)`` (the rate
    clipped to [1e-4, 1 - 1e-4]); returns that logit.

    With the default bias near 0 every first prediction is about 0.5, and at a 1% click
    rate Adam (about ``lr`` per step) needs thousands of steps to move the bias to -4.6;
    until then the sparse tables absorb the offset, which costs AUC and calibration.
    """
    import math

    import torch

    rate = min(max(float(click_rate), 1e-4), 1 - 1e-4)
    logit = math.log(rate / (1 - rate))
    head = model.head
    if not isinstance(head, nn.Module):
        raise ValueError("set_output_bias: the model has no head module")
    last = [m for m in head.modules() if isinstance(m, nn.Linear)]
    if not last:
        raise ValueError("set_output_bias: the model's head has no Linear layer")
    output = _output_layer(head) or last[-1]
    with torch.no_grad():
        output.bias.fill_(logit)
    return logit


def _output_layer(head: nn.Module) -> nn.Linear | None:
    """The last Linear of the head's main MLP (``deep``, ``mlp`` or ``dnn``), if any."""
    for name in ("deep", "mlp", "dnn"):
        block = getattr(head, name, None)
        if isinstance(block, nn.Sequential) and isinstance(block[-1], nn.Linear):
            return block[-1]
    return None
