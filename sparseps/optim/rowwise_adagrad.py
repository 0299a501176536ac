"""Row-wise Adagrad: one accumulator per row (FBGEMM's EXACT_ROWWISE_ADAGRAD).

Per row: ``g += l2 * w; acc += mean(g**2); w -= lr * g / (sqrt(acc) + eps)``. It keeps
one float of state per row instead of ``dim``, which is why large CTR tables use it.

Numerics (:mod:`.numerics`): float64 inside (the step uses the float64 ``acc``, so
``|g_j| / sqrt(acc) <= sqrt(dim)`` even when float32 would round ``mean(g**2)`` to 0);
the stored accumulator saturates at float32's max; a negative stored one counts as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.jit import njit
from .base import Rule, check_nonnegative, check_scale, clip_args, normalise_clip, register
from .numerics import KERNEL, fit32, settle_weight
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["RowwiseAdagrad"]


@register
@dataclass(frozen=True)
class RowwiseAdagrad(Rule):
    """Adagrad with one accumulator per row: the mean of ``g**2`` over the row.

    Args:
        lr: learning rate, in ``[1.2e-38, 3.4e38]``.
        eps: added to ``sqrt(acc)`` in the denominator, in ``[1.2e-38, 3.4e38]``.
        l2: weight decay added to the gradient as ``l2 * w``, in ``[0, 3.4e38]``.
        clip: None or ``(min_bound, max_bound)`` applied to the weights after the step.
    """

    name: ClassVar[str] = "rowwise_adagrad"
    lr: float = 0.05
    eps: float = 1e-10
    l2: float = 0.0
    clip: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        owner = "RowwiseAdagrad"
        object.__setattr__(self, "lr", check_scale(owner, "lr", self.lr))
        object.__setattr__(self, "eps", check_scale(owner, "eps", self.eps))
        object.__setattr__(self, "l2", check_nonnegative(owner, "l2", self.l2))
        object.__setattr__(self, "clip", normalise_clip(owner, self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return (("accumulator", 1),)

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> bool:
        low, high, clip = clip_args(self.clip)
        return _rowwise_adagrad(
            storage, rows, grads, dim, self.lr, self.eps, self.l2, low, high, clip
        )


@njit(**KERNEL)
def _rowwise_adagrad(storage, rows, grads, dim, lr, eps, l2, low, high, clip):  # pragma: no cover
    nan = False
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, dim + 1)
        r = rows[i]
        square_sum = 0.0
        for j in range(dim):
            g = grads[i, j] + l2 * np.float64(storage[r, j])
            square_sum += g * g
        acc = max(np.float64(storage[r, dim]), 0.0) + square_sum / dim
        storage[r, dim] = fit32(acc)
        nan |= acc != acc
        step = lr / (np.sqrt(acc) + eps)
        for j in range(dim):
            w = np.float64(storage[r, j])
            w = w - step * (grads[i, j] + l2 * w)
            w = settle_weight(w, clip, low, high)
            nan |= w != w
            storage[r, j] = w
    return not nan
