"""Adagrad, element-wise accumulator (torch.optim.Adagrad with lr_decay=0).

Per element: ``g += l2 * w; acc += g**2; w -= lr * g / (sqrt(acc) + eps)``.

Numerics (:mod:`.numerics`): float64 inside, so ``acc`` in the step includes ``g**2``
even when float32 would round it to 0, and ``|g| / sqrt(acc) <= 1``: a step moves a
weight by at most ``lr``. The stored accumulator saturates at float32's max (the rule
then keeps working with a very small step), and a negative stored one (only a foreign
checkpoint could hold it) counts as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.jit import njit
from .base import Rule, check_nonnegative, check_scale, clip_args, normalise_clip, register
from .numerics import KERNEL, fit32, settle_weight
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["Adagrad"]


@register
@dataclass(frozen=True)
class Adagrad(Rule):
    """Adagrad with one accumulator per element (state_dim = dim).

    Args:
        lr: learning rate, in ``[1.2e-38, 3.4e38]``.
        initial_accumulator: starting accumulator value, in ``[0, 3.4e38]`` (torch's
            ``initial_accumulator_value``).
        eps: added to ``sqrt(acc)`` in the denominator, in ``[1.2e-38, 3.4e38]``.
        l2: weight decay added to the gradient as ``l2 * w``, in ``[0, 3.4e38]``.
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
        object.__setattr__(self, "lr", check_scale(owner, "lr", self.lr))
        object.__setattr__(
            self,
            "initial_accumulator",
            check_nonnegative(owner, "initial_accumulator", self.initial_accumulator),
        )
        object.__setattr__(self, "eps", check_scale(owner, "eps", self.eps))
        object.__setattr__(self, "l2", check_nonnegative(owner, "l2", self.l2))
        object.__setattr__(self, "clip", normalise_clip(owner, self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return (("accumulator", dim),)

    def initial_state(self, dim: int) -> np.ndarray:
        return np.full(dim, self.initial_accumulator, np.float32)

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> bool:
        low, high, clip = clip_args(self.clip)
        return _adagrad(storage, rows, grads, dim, self.lr, self.eps, self.l2, low, high, clip)


@njit(**KERNEL)
def _adagrad(storage, rows, grads, dim, lr, eps, l2, low, high, clip):  # pragma: no cover
    nan = False
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, 2 * dim)
        r = rows[i]
        for j in range(dim):
            w = np.float64(storage[r, j])
            g = grads[i, j] + l2 * w
            acc = max(np.float64(storage[r, dim + j]), 0.0) + g * g
            storage[r, dim + j] = fit32(acc)
            nan |= acc != acc
            w = w - lr * g / (np.sqrt(acc) + eps)
            w = settle_weight(w, clip, low, high)
            nan |= w != w
            storage[r, j] = w
    return not nan
