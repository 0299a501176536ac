"""Plain SGD: ``w -= lr * (g + l2 * w)`` (torch.optim.SGD with weight_decay=l2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.jit import njit
from ..errors import ConfigError
from .base import Rule, check_nonnegative, check_scale, clip_args, normalise_clip, register
from .numerics import KERNEL, settle_weight
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["SGD"]


@register
@dataclass(frozen=True)
class SGD(Rule):
    """Stochastic gradient descent, no state.

    Args:
        lr: learning rate, in ``[1.2e-38, 3.4e38]`` (float32's normal range).
        l2: L2 penalty added to the gradient as ``l2 * w``, in ``[0, 3.4e38]``; with
            ``lr * l2 >= 2`` every step multiplies the weight by ``1 - lr * l2 <= -1``
            (it diverges even with zero gradients), so that combination is refused.
        clip: None or ``(min_bound, max_bound)`` applied to the weights after the step.
    """

    name: ClassVar[str] = "sgd"
    lr: float = 0.01
    l2: float = 0.0
    clip: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", check_scale("SGD", "lr", self.lr))
        object.__setattr__(self, "l2", check_nonnegative("SGD", "l2", self.l2))
        object.__setattr__(self, "clip", normalise_clip("SGD", self.clip))
        if self.lr * self.l2 >= 2.0:
            raise ConfigError(
                f"SGD: lr * l2 = {self.lr * self.l2:g} must be < 2 (lr={self.lr}, l2={self.l2}): "
                "each step multiplies the weights by 1 - lr * l2, so they would grow without "
                "bound even with zero gradients; lower lr or l2"
            )

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return ()

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> bool:
        low, high, clip = clip_args(self.clip)
        return _sgd(storage, rows, grads, dim, self.lr, self.l2, low, high, clip)


@njit(**KERNEL)
def _sgd(storage, rows, grads, dim, lr, l2, low, high, clip):  # pragma: no cover - compiled
    nan = False
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, dim)
        r = rows[i]
        for j in range(dim):
            w = np.float64(storage[r, j])
            w = w - lr * (grads[i, j] + l2 * w)
            w = settle_weight(w, clip, low, high)
            nan |= w != w
            storage[r, j] = w
    return not nan
