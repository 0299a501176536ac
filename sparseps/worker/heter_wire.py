"""A step's embedding outputs (and their gradients) as one flat float32 buffer.

A model's ``SparseEmbedding`` modules each give one output per step (pooled:
``[B, S, dim]``). The trainer sends them concatenated in module order with their shapes;
the heter worker checks the shapes against its own copy of the model before cutting the
buffer (a peer's shapes are never trusted to size anything) and sends the gradients back
in the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
import torch

from ..errors import ProtocolError

__all__ = ["check_shapes", "join", "split"]


def join(tensors: Sequence[torch.Tensor]) -> tuple[np.ndarray, list[list[int]]]:
    """``(flat float32 buffer, shapes)`` of ``tensors`` (detached, on the host)."""
    if not tensors:
        return np.zeros(0, np.float32), []
    flat = torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])
    return flat.numpy(), [list(t.shape) for t in tensors]


def split(flat: np.ndarray, shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The arrays of ``flat`` cut by ``shapes`` (validated by :func:`check_shapes`)."""
    out, start = [], 0
    for shape in shapes:
        size = prod(shape)
        out.append(flat[start : start + size].reshape(shape))
        start += size
    return out


def check_shapes(
    shapes: object, batch: int, dims: Sequence[tuple[int | None, int]], size: int
) -> list[list[int]]:
    """``shapes`` of a ``heter_step`` request, checked against the model.

    Args:
        shapes: as received.
        batch: the request's batch size.
        dims: per module, ``(slots or None when any, dim)`` of its pooled output.
        size: floats in the request's ``outputs`` buffer.

    Raises:
        ProtocolError: naming the first mismatch.
    """
    if not isinstance(shapes, list) or len(shapes) != len(dims):
        count = len(shapes) if isinstance(shapes, list) else type(shapes).__name__
        raise ProtocolError(
            f"heter_step: 'shapes' must list one shape per SparseEmbedding of the model "
            f"({len(dims)}), got {count}"
        )
    total = 0
    for i, (shape, (slots, dim)) in enumerate(zip(shapes, dims, strict=True)):
        ok = (
            isinstance(shape, list)
            and len(shape) == 3
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            and shape[0] == batch
            and shape[2] == dim
            and (slots is None or shape[1] == slots)
        )
        if not ok:
            raise ProtocolError(
                f"heter_step: output {i} has shape {shape!r:.80}, expected "
                f"[{batch}, {'S' if slots is None else slots}, {dim}] (the model of the "
                "trainer and of the heter worker must be the same)"
            )
        total += prod(shape)
    if total != size:
        raise ProtocolError(f"heter_step: shapes need {total} floats, 'outputs' has {size}")
    return shapes
