"""What the model sees on a heter worker: the batch without its slots, its outputs on the
host, and one step's rows of a device batch's output.

A heter worker runs the model's dense part on embedding outputs the trainers pooled
(:mod:`.heter_service`): the model and its loss get a :class:`RemoteBatch` (dense features
and labels; the slots stay on the trainers), the model's outputs are moved to the host
where the loss and labels are (:class:`OnHost`), and with request gathering
(:mod:`.heter_gather`) each step's loss reads its rows of the stacked output
(:class:`RowsOf`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["OnHost", "RemoteBatch", "RowsOf", "remote_batch"]


@dataclass(frozen=True)
class RemoteBatch:
    """What the model and the loss read of a batch on a heter worker: no slots (their
    embeddings arrive pooled). A model whose ``forward`` reads ``batch.slots`` itself,
    outside its ``SparseEmbedding`` modules, cannot be split."""

    label: np.ndarray
    dense: np.ndarray
    extra_labels: np.ndarray | None
    slots: dict

    def __len__(self) -> int:
        return int(self.label.shape[0])


class OnHost(torch.nn.Module):
    """The model with its outputs moved to the host, where the loss and labels are."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch):
        out = self.model(batch)
        if isinstance(out, torch.Tensor):
            return out.cpu()
        return type(out)(o.cpu() if isinstance(o, torch.Tensor) else o for o in out)


class RowsOf:
    """What a loss calls as the model for one step of a device batch: that step's rows of
    the output the model gave the whole batch (attributes are the model's)."""

    def __init__(self, model: torch.nn.Module, stacked, start: int, stop: int) -> None:
        self._model, self._stacked, self._rows = model, stacked, slice(start, stop)

    def __call__(self, _batch):
        if isinstance(self._stacked, torch.Tensor):
            return self._stacked[self._rows]
        return type(self._stacked)(
            o[self._rows] if isinstance(o, torch.Tensor) else o for o in self._stacked
        )

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def remote_batch(dense: np.ndarray, labels: np.ndarray) -> RemoteBatch:
    """The :class:`RemoteBatch` of stacked dense features and labels (label, then extra)."""
    return RemoteBatch(
        label=labels[:, 0],
        dense=dense,
        extra_labels=labels[:, 1:] if labels.shape[1] > 1 else None,
        slots={},
    )
