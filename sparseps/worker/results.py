"""What the trainer hands back: one batch to the ``on_batch`` callback, one pass's result,
one inference's predictions (:class:`~sparseps.worker.trainer.Trainer`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..metrics import MetricResult, UserStats

__all__ = ["InferResult", "OnBatch", "PassResult", "Step"]


@dataclass(frozen=True)
class Step:
    """One batch as the ``on_batch`` callback sees it (after forward and backward).

    Attributes:
        batch: the :class:`sparseps.data.Batch`.
        loss: the batch's mean loss.
        predictions, labels: float32 ``[B, T]``, one column per task of the loss.
    """

    batch: object
    loss: float
    predictions: np.ndarray
    labels: np.ndarray


# ``on_batch(step, stats)``: called after each batch of a pass (see train_from_dataset).
OnBatch = Callable[[Step, UserStats], None]


@dataclass(frozen=True)
class PassResult:
    """What one training pass did: global metrics and timings of this worker.

    ``metrics`` are those of the loss's first task; ``tasks`` holds every task's by name
    when the loss has several (multi-task models), else it is empty. ``stats``: the
    global values of the statistics the ``on_batch`` callback added.
    """

    metrics: MetricResult
    batches: int
    samples: int
    seconds: float
    timings: dict = field(default_factory=dict)
    tasks: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class InferResult:
    """Predictions of this worker's share of a dataset, and the global metrics.

    ``predictions``/``labels`` are ``[n]`` for a single-task loss and ``[n, T]`` for a
    multi-task one; ``tasks`` as in :class:`PassResult`.
    """

    predictions: np.ndarray
    labels: np.ndarray
    metrics: MetricResult
    tasks: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
