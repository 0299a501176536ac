"""Sparse Adagrad: one ``g2sum`` per row, Paddle's ``SparseAdaGradSGDRule``.

Per row, with ``G`` the row's ``g2sum`` *before* the step::

    g_j += l2 * w_j                       (l2 = 0 in Paddle)
    w_j -= lr * g_j * sqrt(initial_g2sum / (initial_g2sum + G))
    G   += mean_j(g_j ** 2)

then each weight is bounded by ``clip`` (Paddle's ``weight_bounds``, default
``(-10, 10)``). It keeps one float of state per row: the rule of Paddle's CTR accessor
for both the embed and the embedx part. Unlike :class:`~.rowwise_adagrad.RowwiseAdagrad`
(FBGEMM: ``lr * g / (sqrt(acc) + eps)`` with the accumulator *after* the step), the step
uses the accumulator before it, damped by ``initial_g2sum``.

Paddle divides the pushed gradient by the pushed show count first (``show_scale``);
sparseps' workers push the gradient of the batch's loss, which the rule takes as is.

:meth:`SparseAdagrad.update_half` is the same step for rows whose weights are stored as
float16 (:mod:`.half`) after the float32 state: ``[g2sum | halves...]``.

Numerics (:mod:`.numerics`): float64 inside; ``G`` read as ``max(G, 0)``, stored
saturating; the factor is in ``(0, 1]``, so a step moves a weight by at most ``lr * |g|``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.jit import njit
from .base import Rule, check_nonnegative, check_scale, clip_args, normalise_clip, register
from .half import HALF_MAX, float_to_half, half_to_float
from .numerics import KERNEL, fit32, settle_weight
from .prefetch import PREFETCH_AHEAD, prefetch_row

__all__ = ["SparseAdagrad"]


@register
@dataclass(frozen=True)
class SparseAdagrad(Rule):
    """Paddle's sparse Adagrad: one ``g2sum`` per row (state_dim = 1).

    Args:
        lr: learning rate (Paddle's ``learning_rate``), in ``[1.2e-38, 3.4e38]``.
        initial_g2sum: damping of the accumulator (Paddle's ``initial_g2sum``), in
            ``[1.2e-38, 3.4e38]``.
        l2: weight decay added to the gradient as ``l2 * w`` (Paddle has none), in
            ``[0, 3.4e38]``.
        clip: None or ``(min_bound, max_bound)`` (Paddle's ``weight_bounds``).
    """

    name: ClassVar[str] = "sparse_adagrad"
    lr: float = 0.05
    initial_g2sum: float = 3.0
    l2: float = 0.0
    clip: tuple[float, float] | None = (-10.0, 10.0)

    def __post_init__(self) -> None:
        owner = "SparseAdagrad"
        object.__setattr__(self, "lr", check_scale(owner, "lr", self.lr))
        object.__setattr__(
            self, "initial_g2sum", check_scale(owner, "initial_g2sum", self.initial_g2sum)
        )
        object.__setattr__(self, "l2", check_nonnegative(owner, "l2", self.l2))
        object.__setattr__(self, "clip", normalise_clip(owner, self.clip))

    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        return (("g2sum", 1),)

    def update(self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int) -> bool:
        low, high, clip = clip_args(self.clip)
        return _sparse_adagrad(storage, rows, grads, dim, self.lr, self.initial_g2sum, self.l2,
                               low, high, clip)  # fmt: skip

    def update_half(
        self, storage: np.ndarray, halves: np.ndarray, rows: np.ndarray, grads: np.ndarray,
        dim: int,
    ) -> bool:  # fmt: skip
        """:meth:`update` of rows stored as ``[g2sum (float32) | dim float16 weights]``.

        Args:
            storage: float32 ``[R, words]``: column 0 is the g2sum.
            halves: the same memory as uint16 ``[R, 2 * words]``: the weights start at
                column 2.
        """
        low, high, clip = clip_args(self.clip)
        return _sparse_adagrad_half(storage, halves, rows, grads, dim, self.lr,
                                    self.initial_g2sum, self.l2, low, high, clip)  # fmt: skip


@njit(**KERNEL)
def _sparse_adagrad(
    storage, rows, grads, dim, lr, initial, l2, low, high, clip
):  # pragma: no cover
    nan = False
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, dim + 1)
        r = rows[i]
        g2sum = max(np.float64(storage[r, dim]), 0.0)
        step = lr * np.sqrt(initial / (initial + g2sum))
        added = 0.0
        for j in range(dim):
            w = np.float64(storage[r, j])
            g = grads[i, j] + l2 * w
            added += g * g
            w = settle_weight(w - step * g, clip, low, high)
            nan |= w != w
            storage[r, j] = w
        g2sum = g2sum + added / dim
        nan |= g2sum != g2sum
        storage[r, dim] = fit32(g2sum)
    return not nan


@njit(**KERNEL)
def _sparse_adagrad_half(storage, halves, rows, grads, dim, lr, initial, l2, low, high, clip):
    # pragma: no cover - compiled
    nan = False
    n = rows.shape[0]
    for i in range(n):
        if i + PREFETCH_AHEAD < n:
            prefetch_row(storage, rows[i + PREFETCH_AHEAD], 0, storage.shape[1])
        r = rows[i]
        g2sum = max(np.float64(storage[r, 0]), 0.0)
        step = lr * np.sqrt(initial / (initial + g2sum))
        added = 0.0
        for j in range(dim):
            w = half_to_float(halves[r, 2 + j])
            g = grads[i, j] + l2 * w
            added += g * g
            w = settle_weight(w - step * g, clip, low, high)
            nan |= w != w
            halves[r, 2 + j] = float_to_half(min(max(w, -HALF_MAX), HALF_MAX))
        g2sum = g2sum + added / dim
        nan |= g2sum != g2sum
        storage[r, 0] = fit32(g2sum)
    return not nan
