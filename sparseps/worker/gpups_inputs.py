"""A GPUPS step's inputs, host -> device, staged one step ahead.

What a GPUPS step itself sends to its device is input: each table's unique keys of the
batch (looked up in the device table) and their show/click counts (the rule's counters).
:class:`InputStager` copies the next step's while the current one computes:

- on CUDA: pinned host buffers, the copies issued on a side stream, and an event the
  compute stream waits on before the step uses them (``record_stream`` keeps the memory
  until the compute stream is done with it);
- on CPU: the arrays themselves as tensors (views, nothing copied): the path CI runs.

:meth:`GpuPsMode.steps <sparseps.worker.gpups.GpuPsMode.steps>` reads the step after the
current one from the dataset, stages it, then hands the current one out. The lines marked
``CUDA only`` have not run on a GPU yet (no device machine was lent when they were
written; docs/training.md, *GPUPS*).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["InputStager", "StagedInputs", "step_inputs"]


def step_inputs(item) -> dict[str, np.ndarray]:
    """The host arrays a GPUPS step sends to its device, for a trainer item ``(batch,
    lookups, rows)``: per table ``keys/T`` (int64 bits of the uint64 keys), ``shows/T``
    and ``clicks/T`` (float32); empty for None (no data left on this worker)."""
    if item is None:
        return {}
    out = {}
    for name, lookup in item[1].items():
        out[f"keys/{name}"] = np.ascontiguousarray(lookup.keys).view(np.int64)
        out[f"shows/{name}"] = np.ascontiguousarray(lookup.shows, np.float32)
        out[f"clicks/{name}"] = np.ascontiguousarray(lookup.clicks, np.float32)
    return out


class StagedInputs:
    """One step's inputs on the device (or on their way there: :meth:`take` waits)."""

    def __init__(self, tensors: dict[str, torch.Tensor], event=None) -> None:
        self._tensors, self._event = tensors, event

    def take(self) -> dict[str, torch.Tensor]:
        """The tensors, usable on the current stream."""
        if self._event is not None:  # CUDA only (not run: no GPU when written)
            stream = torch.cuda.current_stream(self._event.device)
            stream.wait_event(self._event)
            for tensor in self._tensors.values():
                tensor.record_stream(stream)
            self._event = None
        return self._tensors


class InputStager:
    """Copies a step's inputs to ``device`` ahead of the step (module docstring).

    Args:
        device: the worker's device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = None
        if device.type == "cuda":  # CUDA only (not run: no GPU when written)
            self._stream = torch.cuda.Stream(device)

    def stage(self, arrays: dict[str, np.ndarray]) -> StagedInputs:
        """Start the copies of ``arrays`` (``step_inputs``); returns at once."""
        if self._stream is None:  # CPU: the arrays are the device's memory
            return StagedInputs({k: torch.from_numpy(a) for k, a in arrays.items()})
        # CUDA only (not run: no GPU when written): pinned buffers, side-stream copies
        tensors = {}
        with torch.cuda.stream(self._stream):
            for name, array in arrays.items():
                host = torch.from_numpy(array).pin_memory()
                tensors[name] = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return StagedInputs(tensors, event)
