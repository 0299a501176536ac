"""FTRL-proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", 2013).

Per element, with state ``z`` and ``n``::

    sigma = (sqrt(n + g**2) - sqrt(n)) / alpha
    z += g - sigma * w;  n += g**2
    w = 0                                              if |z| <= l1
        -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)   otherwise

The weight is a function of ``(z, n)``: a row's initial value only matters until its
first update, so FTRL tables normally use ``Initializer.zeros()``. Here ``l2`` is FTRL's
own L2 term (lambda2 in the paper), not a gradient weight decay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import njit

from ..config import check_float
from .base import Rule, clip_args, normalise_clip, register
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["FTRL"]


@register
@dataclass(frozen=True)
class FTRL(Rule):
    """FTRL-proximal; state per row: ``z [dim]``, ``n [dim]`` (state_dim = 2*dim).

    Args:
        alpha: learning-rate scale (> 0).
        beta: learning-rate smoothing (>= 0).
        l1: L1 strength (>= 0); larger values give more exact zeros.
        l2: L2 strength (>= 0).
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
        object.__setattr__(self, "alpha", check_float(owner, "alpha", self.alpha, gt=0.0))
        object.__setattr__(self, "beta", check_float(owner, "beta", self.beta, ge=0.0))
        object.__setattr__(self, "l1", check_float(owner, "l1", self.l1, ge=0.0))
        object.__setattr__(self, "l2", check_float(owner, "l2", self.l2, ge=0.0))
        object.__setattr__(self, "clip", normalise_clip(owner, self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return (("z", dim), ("n", dim))

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> None:
        low, high, clip = clip_args(self.clip)
        _ftrl(storage, rows, grads, dim, self.alpha, self.beta, self.l1, self.l2, low, high, clip)


@njit(nogil=True, cache=True)
def _ftrl(storage, rows, grads, dim, alpha, beta, l1, l2, low, high, clip):  # pragma: no cover
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, 3 * dim)
        r = rows[i]
        for j in range(dim):
            w = storage[r, j]
            g = grads[i, j]
            n_old = storage[r, 2 * dim + j]
            n_new = n_old + g * g
            sigma = (np.sqrt(n_new) - np.sqrt(n_old)) / alpha
            z = storage[r, dim + j] + g - sigma * w
            storage[r, dim + j] = z
            storage[r, 2 * dim + j] = n_new
            if abs(z) <= l1:
                w = 0.0
            else:
                sign = 1.0 if z > 0 else -1.0
                w = -(z - sign * l1) / ((beta + np.sqrt(n_new)) / alpha + l2)
            if clip:
                w = min(max(w, low), high)
            storage[r, j] = w
