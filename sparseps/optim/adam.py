"""Adam with a per-row step counter (lazy / sparse Adam).

Rows are updated only when their key is pushed, and each row counts its own steps, so
the bias correction of a row depends on how often *that row* was updated: exactly what
``torch.optim.Adam`` does when each row is its own parameter and is stepped only when
touched. Per element (torch's L2 form of weight decay)::

    g += l2 * w;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g**2;  t += 1
    w -= lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)

The step counter is stored as float32, exact up to 2**24 updates of one row; past that
the bias corrections are 1 to float precision anyway.

Numerics (:mod:`.numerics`): float64 inside (``v`` in the step includes ``g**2`` even
when float32 would round it to 0); ``1 - beta**t >= 1 - beta > 0`` because ``t >= 1``
(a negative stored counter counts as 0) and ``beta < 1``; ``eps >= 1.2e-38`` keeps the
denominator > 0; stored values saturate at float32's max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.jit import njit
from ..core.validate import check_float
from .base import Rule, check_nonnegative, check_scale, clip_args, normalise_clip, register
from .numerics import KERNEL, fit32, settle_weight
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["Adam"]


@register
@dataclass(frozen=True)
class Adam(Rule):
    """Adam; state per row: ``m [dim]``, ``v [dim]``, ``step [1]`` (state_dim = 2*dim + 1).

    Args:
        lr: learning rate, in ``[1.2e-38, 3.4e38]``.
        beta1, beta2: moment decay rates in [0, 1).
        eps: added to the denominator, in ``[1.2e-38, 3.4e38]``.
        l2: weight decay added to the gradient as ``l2 * w``, in ``[0, 3.4e38]``.
        clip: None or ``(min_bound, max_bound)`` applied to the weights after the step.
    """

    name: ClassVar[str] = "adam"
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    l2: float = 0.0
    clip: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        owner = "Adam"
        object.__setattr__(self, "lr", check_scale(owner, "lr", self.lr))
        object.__setattr__(self, "beta1", check_float(owner, "beta1", self.beta1, ge=0.0, lt=1.0))
        object.__setattr__(self, "beta2", check_float(owner, "beta2", self.beta2, ge=0.0, lt=1.0))
        object.__setattr__(self, "eps", check_scale(owner, "eps", self.eps))
        object.__setattr__(self, "l2", check_nonnegative(owner, "l2", self.l2))
        object.__setattr__(self, "clip", normalise_clip(owner, self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return (("m", dim), ("v", dim), ("step", 1))

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> bool:
        low, high, clip = clip_args(self.clip)
        return _adam(
            storage, rows, grads, dim, self.lr, self.beta1, self.beta2, self.eps, self.l2,
            low, high, clip,
        )  # fmt: skip


@njit(**KERNEL)
def _adam(
    storage, rows, grads, dim, lr, beta1, beta2, eps, l2, low, high, clip
):  # pragma: no cover
    step_col = 2 * dim
    nan = False
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, 3 * dim + 1)
        r = rows[i]
        t = max(np.float64(storage[r, dim + step_col]), 0.0) + 1.0
        storage[r, dim + step_col] = fit32(t)
        step_size = lr / (1.0 - beta1**t)
        correction2 = np.sqrt(1.0 - beta2**t)
        for j in range(dim):
            w = np.float64(storage[r, j])
            g = grads[i, j] + l2 * w
            m = beta1 * np.float64(storage[r, dim + j]) + (1.0 - beta1) * g
            v = beta2 * max(np.float64(storage[r, dim + dim + j]), 0.0) + (1.0 - beta2) * g * g
            storage[r, dim + j] = fit32(m)
            storage[r, dim + dim + j] = fit32(v)
            nan |= (m != m) | (v != v)
            w = w - step_size * m / (np.sqrt(v) / correction2 + eps)
            w = settle_weight(w, clip, low, high)
            nan |= w != w
            storage[r, j] = w
    return not nan
