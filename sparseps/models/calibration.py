"""Calibration of a trained model's mean prediction (issue 29: COPC near 1).

One pass of training leaves the mean prediction of the *final* model off by up to a
factor of two at low click rates, differently on every run: Adam keeps moving the rows of
the most frequent ids by about its learning rate per step until the last one, and at a 1%
click rate a few tenths of a logit is a large share of the predicted clicks. Predictions
made during the pass (progressive validation) average over those moves and do not see
where the last step left the model (measured: shifts from them left test COPC between
0.61 and 1.21 on one data set, docs/training.md).

The fix measures the final model itself: :class:`ProgressiveCalibrator` keeps ``rows`` of a
worker's training rows (whole batches spread over the pass) as an ``on_batch`` callback;
after the pass :meth:`ProgressiveCalibrator.refit` predicts them again with the final
model (all workers together, one all-reduce of a grid of candidate shifts) and solves the
constant logit shift ``d`` with ``sum sigmoid(logit + d) = clicks``. Those rows were trained on, but only
once and at the small per-step moves of the built-in rules, so the model has not learnt
their labels by heart (docs/training.md has the figures); holding rows out instead would
cost training data and, at 0.5% clicks, leave too few clicks to estimate the shift.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..core import collectives

if TYPE_CHECKING:
    from ..worker.trainer import Step, Trainer

__all__ = ["ProgressiveCalibrator", "predicted_clicks", "solve_shift"]

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
    """``on_batch`` callback keeping ``rows`` training rows of a worker (their batches,
    predictions and labels): whole batches drawn uniformly over the pass (a reservoir
    sample), or the last ones (``spread=False``).

    Why spread over the pass: a row's own update moves the final model's prediction of it
    towards its label, and later rows sharing its ids wash that out, so the last rows of a
    pass carry the most of it. On one data set at 1% clicks the final model's clicks /
    predicted clicks were 1.05 on the last 100k rows, 0.99 on rows from the middle of the
    pass and 0.96 on the test rows; on two others the differences stayed within the noise
    of the clicks counted (about 1/sqrt(clicks)), which is what sets ``rows``: as many as
    memory allows (the demo job keeps up to 150k rows per worker, about 75 MB).

    Args:
        rows: how many of this worker's training rows to keep.
        spread: sample the kept batches over the whole pass (default) or keep the last.
        seed: the reservoir's random seed (the same kept rows on every run).
    """

    def __init__(self, rows: int, *, spread: bool = True, seed: int = 0) -> None:
        self.rows = int(rows)
        self.spread = spread
        self._batches: deque = deque()
        self._kept = 0
        self._seen = 0  # batches offered (the reservoir's denominator)
        self._rng = np.random.default_rng(seed)

    def __call__(self, step: Step, stats: object = None) -> None:
        preds = np.asarray(step.predictions)[:, 0].astype(np.float32)
        labels = np.asarray(step.labels)[:, 0].astype(np.float32)
        item = (preds, labels, step.batch)
        self._seen += 1
        if not self.spread or self._kept < self.rows:
            self._batches.append(item)
            self._kept += preds.size
            while self._batches and self._kept - self._batches[0][0].size >= self.rows:
                self._kept -= self._batches.popleft()[0].size
            return
        # reservoir over batches: the i-th replaces a kept one with probability k / i
        slot = int(self._rng.integers(0, self._seen))
        if slot < len(self._batches):
            self._kept += preds.size - self._batches[slot][0].size
            self._batches[slot] = item

    def local(self, preds: np.ndarray | None = None) -> np.ndarray:
        """``[clicks, rows, predicted clicks at every grid shift...]`` of this worker's kept
        rows, with the predictions made during training or ``preds`` (one per kept row)."""
        if not self._batches:
            return np.zeros(2 + GRID.size)
        if preds is None:
            preds = np.concatenate([b[0] for b in self._batches])
        labels = np.concatenate([b[1] for b in self._batches])
        return np.concatenate([[labels.sum(), labels.size], predicted_clicks(preds)])

    def refit(self, trainer: Trainer) -> float:
        """The logit shift for the model as training left it: the kept rows predicted again
        by ``trainer`` (collective: every worker calls it; the model's own shift must be
        0), then :meth:`shift` over every worker's rows."""
        result = trainer.infer_from_dataset([b[2] for b in self._batches])
        preds = np.asarray(result.predictions, np.float32).reshape(-1)
        local = self.local(preds if self._batches else None)
        return solve_shift(*_split(collectives.all_reduce_sum(local)))

    def shift(self, all_reduce_sum: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
        """The logit shift making predicted clicks equal actual clicks over every worker's
        kept rows (``all_reduce_sum``: a function summing an array over workers; None:
        this worker only)."""
        total = self.local()
        if all_reduce_sum is not None:
            total = np.asarray(all_reduce_sum(total), np.float64)
        return solve_shift(*_split(total))


def _split(total: np.ndarray) -> tuple[np.ndarray, float]:
    """``(predicted clicks per grid shift, clicks)`` of a :meth:`local` array."""
    total = np.asarray(total, np.float64)
    return total[2:], float(total[0])
