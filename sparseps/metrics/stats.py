"""User statistics reduced across workers, and the public ``sps.all_reduce``.

Paddle's ``fleet.metrics.sum / max / min`` reduce a number or an array the training loop
computed. Here a training loop *declares* a statistic by adding to it, by name, with its
reduction; the trainer hands one :class:`UserStats` to the ``on_batch`` callback of each
pass and returns the global values in ``PassResult.stats``::

    def on_batch(step, stats):
        stats.add("clicks", step.labels.sum())                  # sum over batches and workers
        stats.add("max_pred", step.predictions.max(), op="max")
        stats.add("slot_len", lengths_per_slot, op="sum")       # an array: element-wise

    result = trainer.train_from_dataset(ds, on_batch=on_batch)
    result.stats["clicks"]                                     # a float (or an ndarray)

A statistic keeps a fixed shape (a number, or an array/tensor of one shape); each
``add`` combines element-wise with ``op`` (``sum``, ``max``, ``min``). ``compute(global_=True)``
reduces every statistic over the workers in one collective per reduction op; workers
must declare the same names (a worker that saw no batch still takes part: a name it never
added counts as the op's identity: 0, -inf, +inf).

:func:`all_reduce` is the same collective for a single value outside any pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from . import distributed
from .distributed import REDUCE_OPS

__all__ = ["UserStats", "all_reduce"]

# what all_reduce and UserStats.add take: a number, a numpy array or a torch tensor
Reducible = Any

_IDENTITY = {"sum": 0.0, "max": -np.inf, "min": np.inf}
_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _as_array(value: object, where: str) -> tuple[np.ndarray, str]:
    """``(float64 array, kind)`` of a number, numpy array or torch tensor."""
    kind = "number"
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value, kind = value.detach().cpu().numpy(), "tensor"
    elif isinstance(value, np.ndarray):
        kind = "array"
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise InputError(f"{where}: expected a real number, array or tensor, got {array.dtype}")
    if kind == "number" and array.ndim:
        kind = "array"
    return array.astype(np.float64), kind


def _check_op(op: object, where: str) -> str:
    if op not in REDUCE_OPS:
        raise InputError(f"{where}: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    return op  # type: ignore[return-value]


def _restore(array: np.ndarray, kind: str):
    if kind == "number":
        return float(array.reshape(()))
    if kind == "tensor":
        import torch

        return torch.from_numpy(array)
    return array


def all_reduce(
    value: Reducible, op: str = "sum", *, timeout: float = distributed.DEFAULT_TIMEOUT_S
) -> Reducible:
    """``op`` (sum, max, min) of ``value`` over every worker; every worker must call it.

    Args:
        value: a number, a numpy array or a torch tensor (the same shape on every worker).
        op: ``"sum"``, ``"max"`` or ``"min"``.
        timeout: seconds to wait for the other workers.

    Returns:
        the reduced value as a float (for a number), a float64 ndarray or a float64 tensor.
        Without a process group (one worker) the value itself, as that type.

    Raises:
        InputError: an unknown op or a non-numeric value.
        DeadlineError, UnavailableError: a worker did not take part.
    """
    op = _check_op(op, "all_reduce")
    array, kind = _as_array(value, "all_reduce")
    reduced = distributed.all_reduce_array(array.reshape(-1), op, timeout=timeout)
    return _restore(reduced.reshape(array.shape), kind)


class UserStats:
    """Named statistics of a pass: ``add`` per batch, ``compute`` per pass (see module)."""

    def __init__(self) -> None:
        self._values: dict[str, np.ndarray] = {}
        self._ops: dict[str, str] = {}
        self._kinds: dict[str, str] = {}

    def add(self, name: str, value: Reducible, op: str = "sum") -> None:
        """Combine ``value`` into statistic ``name`` with ``op`` (declared by its first add).

        Raises:
            InputError: a name re-declared with another op or shape, or a bad value.
        """
        where = f"UserStats.add({name!r})"
        if not isinstance(name, str) or not name:
            raise InputError(f"UserStats.add: name must be a non-empty string, got {name!r}")
        op = _check_op(op, where)
        array, kind = _as_array(value, where)
        if name not in self._values:
            self._values[name], self._ops[name], self._kinds[name] = array.copy(), op, kind
            return
        if self._ops[name] != op or self._values[name].shape != array.shape:
            raise InputError(
                f"{where}: declared as op={self._ops[name]!r} shape "
                f"{self._values[name].shape}, now op={op!r} shape {array.shape}"
            )
        _COMBINE[op](self._values[name], array, out=self._values[name])

    @property
    def names(self) -> Sequence[str]:
        return tuple(self._values)

    def compute(
        self, *, global_: bool = False, timeout: float = distributed.DEFAULT_TIMEOUT_S
    ) -> dict:
        """``{name: value}`` (local, or over every worker: a collective).

        Globally, the names (and their ops and shapes) are agreed first: a worker that
        never added a name contributes the op's identity for it.
        """
        if not global_ or distributed.group_size() == 1:
            return {n: _restore(v.copy(), self._kinds[n]) for n, v in self._values.items()}
        declared = self._agree(timeout)
        out = {}
        for op in REDUCE_OPS:
            names = [n for n, (o, _, _) in declared.items() if o == op]
            if not names:
                continue
            parts = [
                self._values[n].reshape(-1)
                if n in self._values
                else np.full(int(np.prod(declared[n][1])), _IDENTITY[op])
                for n in names
            ]
            flat = distributed.all_reduce_array(np.concatenate(parts), op, timeout=timeout)
            start = 0
            for n in names:
                shape, kind = declared[n][1], declared[n][2]
                size = int(np.prod(shape))
                out[n] = _restore(flat[start : start + size].reshape(shape), kind)
                start += size
        return out

    def _agree(self, timeout: float) -> dict[str, tuple[str, tuple, str]]:
        """Every worker's declarations, merged (name -> (op, shape, kind)), sorted by name."""
        import json

        import torch.distributed as dist

        mine = {n: (self._ops[n], list(v.shape), self._kinds[n]) for n, v in self._values.items()}
        gathered: list = [None] * distributed.group_size()
        dist.all_gather_object(gathered, json.dumps(mine, sort_keys=True))
        merged: dict[str, tuple[str, tuple, str]] = {}
        for text in gathered:
            for name, (op, shape, kind) in json.loads(text).items():
                found = merged.setdefault(name, (op, tuple(shape), kind))
                if found[:2] != (op, tuple(shape)):
                    raise InputError(
                        f"UserStats: workers declare {name!r} differently ({found[0]} "
                        f"{found[1]} vs {op} {tuple(shape)})"
                    )
        return dict(sorted(merged.items()))
