"""FTRL-proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", 2013).

Per element, with state ``z`` and ``n``::

    sigma = (sqrt(n + g**2) - sqrt(n)) / alpha
    z += g - sigma * w;  n += g**2
    w = 0                                              if |z| <= l1
        -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)   otherwise

The weight is a function of ``(z, n)``: a row's initial value only matters until its
first update, so FTRL tables normally use ``Initializer.zeros()``. Here ``l2`` is FTRL's
own L2 term (lambda2 in the paper), not a gradient weight decay.

Numerics (:mod:`.numerics`; the cause of issue 28). With ``beta = 0`` and ``l2 = 0`` the
denominator is ``sqrt(n) / alpha``, 0 while ``n`` is. In float32, ``g*g`` underflows to 0
for ``|g| < ~1e-23`` while ``z`` still moves by ``g``, so ``n`` stayed 0 with ``z != 0``
and the kernel divided by zero. Now:

- arithmetic is float64, and a gradient with ``|g| < 2**-63`` (~1.1e-19, whose square
  float32 ``n`` cannot hold as a normal number) is *flushed to 0*: it changes neither
  ``z`` nor ``n``. So ``z`` moves only together with ``n``, and a row that starts at
  ``z = n = 0`` keeps ``n > 0`` whenever ``z != 0``;
- a denominator that is still not > 0 (only a foreign checkpoint with ``z != 0, n = 0``
  could give one) yields ``w = 0``; a negative stored ``n`` counts as 0;
- ``alpha >= 1.2e-38`` keeps ``1 / alpha`` finite; stored values saturate at float32's max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.jit import njit
from .base import Rule, check_nonnegative, check_scale, clip_args, normalise_clip, register
from .numerics import KERNEL, fit32, settle_weight
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["FTRL"]


@register
@dataclass(frozen=True)
class FTRL(Rule):
    """FTRL-proximal; state per row: ``z [dim]``, ``n [dim]`` (state_dim = 2*dim).

    Args:
        alpha: learning-rate scale, in ``[1.2e-38, 3.4e38]``.
        beta: learning-rate smoothing, in ``[0, 3.4e38]``; 0 is allowed (the first
            step of a feature then moves its weight by about ``alpha`` whatever the
            gradient's size: see the module notes).
        l1: L1 strength, in ``[0, 3.4e38]``; larger values give more exact zeros.
        l2: L2 strength, in ``[0, 3.4e38]``.
        clip: None or ``(min_bound, max_bound)`` applied to the weights after the step.
    """

    name: ClassVar[str] = "ftrl"
    alpha: float = 0.05
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0
    clip: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        owner = "FTRL"
        object.__setattr__(self, "alpha", check_scale(owner, "alpha", self.alpha))
        object.__setattr__(self, "beta", check_nonnegative(owner, "beta", self.beta))
        object.__setattr__(self, "l1", check_nonnegative(owner, "l1", self.l1))
        object.__setattr__(self, "l2", check_nonnegative(owner, "l2", self.l2))
        object.__setattr__(self, "clip", normalise_clip(owner, self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return (("z", dim), ("n", dim))

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> bool:
        low, high, clip = clip_args(self.clip)
        return _ftrl(
            storage, rows, grads, dim, self.alpha, self.beta, self.l1, self.l2, low, high, clip
        )


#: gradients smaller than this are flushed to 0 (their square is below float32's normal range)
FLUSH = 2.0**-63


@njit(**KERNEL)
def _ftrl(storage, rows, grads, dim, alpha, beta, l1, l2, low, high, clip):  # pragma: no cover
    nan = False
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, 3 * dim)
        r = rows[i]
        for j in range(dim):
            w = np.float64(storage[r, j])
            g = np.float64(grads[i, j])
            if abs(g) < FLUSH:
                g = 0.0
            n_old = max(np.float64(storage[r, 2 * dim + j]), 0.0)
            n_new = fit32(n_old + g * g)
            sigma = (np.sqrt(n_new) - np.sqrt(n_old)) / alpha
            z = fit32(np.float64(storage[r, dim + j]) + g - sigma * w)
            storage[r, dim + j] = z
            storage[r, 2 * dim + j] = n_new
            nan |= (z != z) | (n_new != n_new)
            if abs(z) <= l1:
                w = 0.0
            else:
                sign = 1.0 if z > 0 else -1.0
                denominator = (beta + np.sqrt(n_new)) / alpha + l2
                w = -(z - sign * l1) / denominator if denominator > 0.0 else 0.0
            w = settle_weight(w, clip, low, high)
            nan |= w != w
            storage[r, j] = w
    return not nan
