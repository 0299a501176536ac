"""Small building blocks shared by the built-in models."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .. import optim
from ..config import Accessor, Initializer, Lifecycle
from ..worker.nn import SparseEmbedding

__all__ = ["CvmNorm", "ctr_accessor", "mlp", "set_output_bias", "slot_embedding"]


MLP_INITS = ("torch", "glorot")


def mlp(in_features: int, hidden: Sequence[int], out_features: int = 1, *,
        init: str = "torch") -> nn.Sequential:  # fmt: skip
    """``Linear -> ReLU`` for each hidden width, then a final ``Linear``.

    ``init``: ``"torch"`` (PyTorch's default: weights and biases uniform in
    ``±1/sqrt(fan_in)``) or ``"glorot"`` (Keras's default, what the TensorFlow and Paddle
    peers start from: weights uniform in ``±sqrt(6 / (fan_in + fan_out))``, biases zero).
    """
    if init not in MLP_INITS:
        raise ValueError(f"mlp init {init!r}: expected one of {MLP_INITS}")
    layers: list[nn.Module] = []
    width = in_features
    for size in [*hidden, out_features]:
        layer = nn.Linear(width, size)
        if init == "glorot":
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        layers += [layer, nn.ReLU()]
        width = size
    return nn.Sequential(*layers[:-1])


class CvmNorm(nn.Module):
    """``[B, S, w] -> [B, S * w]``: the slots' embeddings flattened for an MLP, their cvm
    features (the first two columns of each slot, when ``cvm``) normalised by running
    batch statistics, then multiplied by ``scale``. Without ``cvm`` it only flattens.

    Why normalised: Paddle's models put a ``data_norm`` after the cvm op; log(show + 1)
    reaches ~15 where embedding weights are ~0.01, and an MLP fed the raw values trains
    badly (the demo on bench quality's ctr1% family: test AUC 0.693 against 0.830
    without cvm). Why then scaled down (``scale=0.1``, about the embeddings' size): at
    unit variance the counts, which are noisy for the many rare ids and larger at test
    time than while a pass counted them, took over the MLP's first steps: -0.020 test
    AUC at 1% clicks (0.810), where 0.1 gives 0.828 (0.831 with an embedx_threshold)
    and 0.03 about the same; the model still weighs them up where they help. Measured
    with ``bench/_accessor_curve.py``'s runs, bench/RESULTS.md.
    """

    def __init__(self, num_slots: int, *, cvm: bool, scale: float = 0.1) -> None:
        super().__init__()
        self.cvm = cvm
        self.scale = float(scale)
        self.norm = nn.BatchNorm1d(2 * num_slots, affine=False) if cvm else None

    def forward(self, emb):
        if self.norm is None:
            return emb.flatten(1)
        # torch at module level: torch.jit.script (the serving tests' heads) cannot
        # compile an import inside forward
        counts = self.norm(emb[:, :, :2].flatten(1)) * self.scale
        return torch.cat([counts, emb[:, :, 2:].flatten(1)], 1)


def slot_embedding(
    table: str,
    dim: int,
    slots: Sequence[str],
    rule: optim.Rule | None = None,
    *,
    zeros: bool = False,
    lifecycle: Lifecycle | None = None,
    memory_rows: int | None = None,
    cvm: bool = False,
    accessor: Accessor | None = None,
    init_scale: float = 0.05,
) -> SparseEmbedding:
    """The built-in models' sum-pooled embedding of every slot: Adam(0.01) unless ``rule``
    is given; rows start uniform in [-init_scale, init_scale] (0.05 by default), or at zero
    (``zeros``, for linear parts);
    ``memory_rows``: the table's memory budget per server (None: all rows in memory);
    ``cvm``/``accessor``: see :class:`~sparseps.nn.SparseEmbedding`."""
    return SparseEmbedding(
        table,
        dim,
        slots=tuple(slots),
        rule=rule or optim.Adam(lr=0.01),
        initializer=Initializer.zeros()
        if zeros or init_scale == 0
        else Initializer.uniform(-init_scale, init_scale),
        lifecycle=lifecycle,
        memory_rows=memory_rows,
        cvm=cvm,
        accessor=accessor,
    )


def ctr_accessor(embedx_threshold: float | None, embedx_dtype: str, embed_rule) -> Accessor | None:
    """The built-in models' CTR accessor (Paddle's): an embed part (``embed_rule``,
    starting at zero: the linear weight of a feature) and an embedx part stored once a
    feature's show/click score reaches ``embedx_threshold``; None without a threshold."""
    if embedx_threshold is None:
        return None
    return Accessor(embed_dim=1, embed_rule=embed_rule, embedx_threshold=embedx_threshold,
                    embedx_dtype=embedx_dtype)  # type: ignore[arg-type]  # fmt: skip


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
