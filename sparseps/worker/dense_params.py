"""The dense part of a model as one flat float32 vector (what dense tables store)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["DenseParams"]


class DenseParams:
    """Views a module's trainable parameters as one flat vector, in a fixed order.

    The order is ``module.parameters()`` order, identical on every worker that built the
    same model, so a flat vector can be exchanged with servers and other workers.
    """

    def __init__(self, module: nn.Module) -> None:
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.size = int(sum(p.numel() for p in self.params))

    def values(self) -> np.ndarray:
        if not self.params:
            return np.zeros(0, np.float32)
        with torch.no_grad():
            return (
                torch.nn.utils.parameters_to_vector(self.params)
                .cpu()
                .numpy()
                .astype(np.float32, copy=True)
            )

    def grads(self) -> np.ndarray:
        """The flat gradient (zeros where a parameter got none), in a new array."""
        if not self.params:
            return np.zeros(0, np.float32)
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params
        ]
        return torch.cat(parts).cpu().numpy().astype(np.float32, copy=False)

    def set(self, values: np.ndarray) -> None:
        if not self.params:
            return
        with torch.no_grad():
            vector = torch.from_numpy(np.ascontiguousarray(values, np.float32))
            torch.nn.utils.vector_to_parameters(vector.to(self.params[0].device), self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
