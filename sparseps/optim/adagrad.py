"""Adagrad, element-wise accumulator (torch.optim.Adagrad with lr_decay=0).

Per element: ``g += l2 * w; acc += g**2; w -= lr * g / (sqrt(acc) + eps)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import njit

from ..config import check_float
from .base import Rule, clip_args, normalise_clip, register
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["Adagrad"]


@register
@dataclass(frozen=True)
class Adagrad(Rule):
    """Adagrad with one accumulator per element (state_dim = dim).

    Args:
        lr: learning rate (> 0).
        initial_accumulator: starting accumulator value (>= 0), torch's
            ``initial_accumulator_value``.
        eps: added to ``sqrt(acc)`` in the denominator (> 0).
        l2: weight decay added to the gradient as ``l2 * w`` (>= 0).
        clip: None or ``(min_bound, max_bound)`` applied to the weights after the step.
    """

    name: ClassVar[str] = "adagrad"
    lr: float = 0.05
    initial_accumulator: float = 0.0
    eps: float = 1e-10
    l2: float = 0.0
    clip: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        owner = "Adagrad"
        object.__setattr__(self, "lr", check_float(owner, "lr", self.lr, gt=0.0))
        object.__setattr__(
            self,
            "initial_accumulator",
            check_float(owner, "initial_accumulator", self.initial_accumulator, ge=0.0),
        )
        object.__setattr__(self, "eps", check_float(owner, "eps", self.eps, gt=0.0))
        object.__setattr__(self, "l2", check_float(owner, "l2", self.l2, ge=0.0))
        object.__setattr__(self, "clip", normalise_clip(owner, self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return (("accumulator", dim),)

    def initial_state(self, dim: int) -> np.ndarray:
        return np.full(dim, self.initial_accumulator, np.float32)

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> None:
        low, high, clip = clip_args(self.clip)
        _adagrad(storage, rows, grads, dim, self.lr, self.eps, self.l2, low, high, clip)


@njit(nogil=True, cache=True)
def _adagrad(storage, rows, grads, dim, lr, eps, l2, low, high, clip):  # pragma: no cover
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, 2 * dim)
        r = rows[i]
        for j in range(dim):
            w = storage[r, j]
            g = grads[i, j] + l2 * w
            acc = storage[r, dim + j] + g * g
            storage[r, dim + j] = acc
            w = w - lr * g / (np.sqrt(acc) + eps)
            if clip:
                w = min(max(w, low), high)
            storage[r, j] = w
