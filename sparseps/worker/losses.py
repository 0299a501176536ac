"""The loss of a :class:`~sparseps.Trainer`: what it minimises and what its metrics see.

A loss is one small protocol (:class:`Loss`): given the model and a batch it runs the
forward pass and returns a :class:`LossOutput` — the *summed* loss of the batch (the
trainer divides by the batch size, or by the global batch size in sync mode), the
predicted probabilities and the 0/1 labels the metrics are computed from, one column
per task. The trainer never asks which loss it holds.

- :class:`BinaryCrossEntropy` (the default): ``model(batch)`` returns logits ``[B]``;
  loss ``BCE(sigmoid(logits), batch.label)``; one task.
- :func:`as_loss` wraps a plain function ``fn(logits, batch) -> Tensor`` (per-sample
  losses ``[B]``, summed by the trainer; a 0-d tensor is taken as the batch's sum):
  a weighted or focal loss on the same single-task model. Predictions stay
  ``sigmoid(logits)`` against ``batch.label``.
- multi-task losses (``tasks`` of more than one name) report one metric set per task;
  see :class:`sparseps.models.ESMMLoss`-style implementations in ``examples/esmm``.

Labels of several columns come from ``batch.label`` (the schema's ``label``) and
``batch.extra_labels`` (``[B, K]``, the schema's ``extra_labels`` in order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError, InputError

__all__ = ["BinaryCrossEntropy", "Loss", "LossOutput", "as_loss", "label_column"]


@dataclass(frozen=True)
class LossOutput:
    """One batch through a loss.

    Attributes:
        loss: 0-d tensor, the sum of the per-sample losses (backward runs from it).
        predictions: float32 ``[B, T]`` probabilities in ``[0, 1]``, one column per task.
        labels: float32 ``[B, T]`` 0/1 labels, same layout.
    """

    loss: torch.Tensor
    predictions: np.ndarray
    labels: np.ndarray


class Loss:
    """The protocol: ``tasks`` (names, one per metric set) and ``__call__(model, batch)``."""

    tasks: tuple[str, ...] = ("",)

    def __call__(self, model, batch) -> LossOutput:  # pragma: no cover - protocol
        raise NotImplementedError


def label_column(batch, name_or_index: int) -> np.ndarray:
    """Label column ``0`` (``batch.label``) or ``k >= 1`` (``batch.extra_labels[:, k-1]``)."""
    if name_or_index == 0:
        return np.asarray(batch.label, np.float32)
    extra = getattr(batch, "extra_labels", None)
    if extra is None or extra.ndim != 2 or extra.shape[1] < name_or_index:
        raise InputError(
            f"label column {name_or_index} is not in the batch (it has "
            f"{0 if extra is None else extra.shape[1]} extra label columns); declare them "
            "with Schema(extra_labels=(...))"
        )
    return np.ascontiguousarray(extra[:, name_or_index - 1], np.float32)


def _probabilities(logits: torch.Tensor) -> np.ndarray:
    return torch.sigmoid(logits.detach()).cpu().numpy().astype(np.float32).reshape(-1, 1)


class BinaryCrossEntropy(Loss):
    """``BCE-with-logits(model(batch), batch.label)``, summed: the trainer's default."""

    def __call__(self, model, batch) -> LossOutput:
        logits = model(batch).reshape(-1)
        labels = np.asarray(batch.label, np.float32)
        target = torch.from_numpy(labels).to(logits.device)  # gpups: the model's device
        loss = F.binary_cross_entropy_with_logits(logits, target, reduction="sum")
        return LossOutput(loss, _probabilities(logits), labels.reshape(-1, 1))


class _FunctionLoss(Loss):
    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def __call__(self, model, batch) -> LossOutput:
        logits = model(batch).reshape(-1)
        value = self.fn(logits, batch)
        if not isinstance(value, torch.Tensor):
            raise InputError(
                f"loss {getattr(self.fn, '__name__', self.fn)!r}: returned "
                f"{type(value).__name__}, expected a tensor (per-sample losses [B] or a sum)"
            )
        if value.ndim not in (0, 1) or (value.ndim == 1 and value.shape[0] != logits.shape[0]):
            raise InputError(
                f"loss {getattr(self.fn, '__name__', self.fn)!r}: returned shape "
                f"{tuple(value.shape)}, expected [{logits.shape[0]}] or a 0-d sum"
            )
        labels = np.asarray(batch.label, np.float32).reshape(-1, 1)
        return LossOutput(value.sum(), _probabilities(logits), labels)

    def __repr__(self) -> str:
        return f"as_loss({getattr(self.fn, '__qualname__', self.fn)})"


def as_loss(loss) -> Loss:
    """A :class:`Loss` from ``None`` (BCE), a ``Loss``, or a function ``fn(logits, batch)``.

    Raises:
        ConfigError: anything else (names what was given).
    """
    if loss is None:
        return BinaryCrossEntropy()
    if isinstance(loss, Loss):
        if not loss.tasks or len(set(loss.tasks)) != len(loss.tasks):
            raise ConfigError(f"Trainer.loss: tasks must be distinct names, got {loss.tasks!r}")
        return loss
    if callable(loss):
        return _FunctionLoss(loss)
    raise ConfigError(
        "Trainer.loss: expected a sparseps.worker.losses.Loss or a function "
        f"fn(logits, batch) -> per-sample losses, got {type(loss).__name__}"
    )
