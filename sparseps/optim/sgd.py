"""Plain SGD: ``w -= lr * (g + l2 * w)`` (torch.optim.SGD with weight_decay=l2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import njit

from ..config import check_float
from .base import Rule, clip_args, normalise_clip, register
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["SGD"]


@register
@dataclass(frozen=True)
class SGD(Rule):
    """Stochastic gradient descent, no state.

    Args:
        lr: learning rate (> 0).
        l2: L2 penalty added to the gradient as ``l2 * w`` (>= 0).
        clip: None or ``(min_bound, max_bound)`` applied to the weights after the step.
    """

    name: ClassVar[str] = "sgd"
    lr: float = 0.01
    l2: float = 0.0
    clip: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", check_float("SGD", "lr", self.lr, gt=0.0))
        object.__setattr__(self, "l2", check_float("SGD", "l2", self.l2, ge=0.0))
        object.__setattr__(self, "clip", normalise_clip("SGD", self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return ()

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> None:
        low, high, clip = clip_args(self.clip)
        _sgd(storage, rows, grads, dim, self.lr, self.l2, low, high, clip)


@njit(nogil=True, cache=True)
def _sgd(storage, rows, grads, dim, lr, l2, low, high, clip):  # pragma: no cover - compiled
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, dim)
        r = rows[i]
        for j in range(dim):
            w = storage[r, j]
            w = w - lr * (grads[i, j] + l2 * w)
            if clip:
                w = min(max(w, low), high)
            storage[r, j] = w
