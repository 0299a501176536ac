"""Calibration of a trained model's mean prediction (issue 29: COPC near 1).

One pass of asynchronous training leaves the mean prediction off by 10-30% at low click
rates (the output bias and the sparse parts keep moving until the last step). The fix is
the production one: measure, on predictions the model made *before* it trained on those
rows (progressive validation over the last rows of the pass), how far predicted clicks
are from actual clicks, and add the constant logit shift that makes them equal.

:class:`ProgressiveCalibrator` collects the last ``rows`` predictions and labels of a
worker as an ``on_batch`` callback; :meth:`ProgressiveCalibrator.shift` solves, over every
worker's collected rows (one all-reduce of a grid of candidate shifts), the shift ``d``
with ``sum sigmoid(logit + d) = clicks``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..worker.trainer import Step

__all__ = ["ProgressiveCalibrator", "solve_shift"]

GRID = np.linspace(-3.0, 3.0, 241)  # candidate shifts, 0.025 apart (then interpolated)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    return np.log(p / (1 - p))


def predicted_clicks(preds: np.ndarray, grid: np.ndarray = GRID) -> np.ndarray:
    """``sum_i sigmoid(logit(p_i) + d)`` for every shift ``d`` of ``grid``."""
    out = np.zeros(grid.size)
    logits = _logit(preds)
    for start in range(0, logits.size, 8192):  # bounded memory: [8192, grid]
        chunk = logits[start : start + 8192, None] + grid[None, :]
        out += (1.0 / (1.0 + np.exp(-chunk))).sum(axis=0)
    return out


def solve_shift(predicted: np.ndarray, clicks: float, grid: np.ndarray = GRID) -> float:
    """The shift where ``predicted`` (increasing along ``grid``) crosses ``clicks``
    (linear interpolation; clamped to the grid; 0 when there is nothing to match)."""
    if clicks <= 0 or predicted[-1] <= 0:
        return 0.0
    return float(np.interp(clicks, predicted, grid))


class ProgressiveCalibrator:
    """``on_batch`` callback keeping the last ``rows`` (prediction, label) pairs.

    Args:
        rows: how many of this worker's last training rows to keep.
    """

    def __init__(self, rows: int) -> None:
        self.rows = int(rows)
        self._batches: deque = deque()
        self._kept = 0

    def __call__(self, step: Step, stats: object = None) -> None:
        preds = np.asarray(step.predictions)[:, 0].astype(np.float32)
        labels = np.asarray(step.labels)[:, 0].astype(np.float32)
        self._batches.append((preds, labels))
        self._kept += preds.size
        while self._batches and self._kept - self._batches[0][0].size >= self.rows:
            self._kept -= self._batches.popleft()[0].size

    def local(self) -> np.ndarray:
        """``[clicks, rows, predicted clicks at every grid shift...]`` of this worker."""
        if not self._batches:
            return np.zeros(2 + GRID.size)
        preds = np.concatenate([b[0] for b in self._batches])
        labels = np.concatenate([b[1] for b in self._batches])
        return np.concatenate([[labels.sum(), labels.size], predicted_clicks(preds)])

    def shift(self, all_reduce_sum: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
        """The logit shift making predicted clicks equal actual clicks over every worker's
        kept rows (``all_reduce_sum``: a function summing an array over workers; None:
        this worker only)."""
        total = self.local()
        if all_reduce_sum is not None:
            total = np.asarray(all_reduce_sum(total), np.float64)
        return solve_shift(total[2:], float(total[0]))
