"""The collectives the metric accumulators need, over ``torch.distributed`` (gloo).

Kept apart from the math so that :mod:`~sparseps.metrics.functions` stays pure and the
accumulator only says *what* to combine. Only int64 tensors travel: integer sums are
exact and independent of the reduction order, which is what makes a global metric equal,
bit for bit, to the metric of one process holding all the data.

Every call waits at most ``timeout`` seconds and turns a stuck or broken peer into a
:class:`~sparseps.errors.DeadlineError` or :class:`~sparseps.errors.UnavailableError`
(:func:`~sparseps.core.deadline.wait_collective`: in a launched job a timeout first dumps
every role's stacks, and its message names the folder).
``torch`` is imported on first use, so importing the metrics package stays light.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..core.deadline import wait_collective

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup, Work

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "REDUCE_OPS",
    "all_gather_rows",
    "all_reduce_array",
    "all_reduce_sum",
    "group_size",
]

log = logging.getLogger(__name__)

# Global metrics are computed at the end of a pass, when the workers meet: the first one
# to arrive waits for the slowest, so the limit is generous.
DEFAULT_TIMEOUT_S = 1800.0


def group_size(group: ProcessGroup | None = None) -> int:
    """Number of workers in ``group`` (the default group when None); 1 when not initialised."""
    import torch.distributed as dist

    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _wait(work: Work | None, op: str, group: ProcessGroup | None, timeout: float) -> None:
    import torch.distributed as dist

    wait_collective(
        work,
        op=f"metrics {op}",
        timeout=timeout,
        rank=dist.get_rank(group),
        setting="timeout argument of CTRMetrics.compute()",
        hint="raise the timeout= argument of compute() if passes are uneven",
    )


def all_reduce_sum(
    array: np.ndarray, *, group: ProcessGroup | None = None, timeout: float
) -> np.ndarray:
    """Element-wise sum of an int64 array over the workers of ``group``; returns a new array."""
    import torch
    import torch.distributed as dist

    if array.dtype != np.int64:
        raise TypeError(f"all_reduce_sum sends int64 only (exact sums), got {array.dtype}")
    tensor = torch.from_numpy(np.array(array, dtype=np.int64, copy=True))
    if group_size(group) == 1:
        return tensor.numpy()
    log.debug("all-reducing %d int64 metric values", tensor.numel())
    _wait(dist.all_reduce(tensor, group=group, async_op=True), "all_reduce", group, timeout)
    return tensor.numpy()


REDUCE_OPS = ("sum", "max", "min")


def all_reduce_array(
    array: np.ndarray, op: str, *, group: ProcessGroup | None = None, timeout: float
) -> np.ndarray:
    """Element-wise ``op`` (sum, max, min) of a float64 or int64 array over the workers.

    Every worker must pass the same shape and dtype. Returns a new array. Float sums are
    the gloo reduction's (the same bits on every worker, but not those of one process
    adding the numbers in another order).
    """
    import torch
    import torch.distributed as dist

    if op not in REDUCE_OPS:
        raise ValueError(f"all_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
    if array.dtype not in (np.float64, np.int64):
        raise TypeError(f"all_reduce_array takes float64 or int64, got {array.dtype}")
    tensor = torch.from_numpy(np.array(array, copy=True))
    if group_size(group) == 1:
        return tensor.numpy()
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    _wait(
        dist.all_reduce(tensor, op=reduce_op, group=group, async_op=True),
        f"all_reduce ({op})",
        group,
        timeout,
    )
    return tensor.numpy()


def all_gather_rows(
    rows: np.ndarray, *, group: ProcessGroup | None = None, timeout: float
) -> np.ndarray:
    """Concatenate an int64 ``[m_r, k]`` array from every worker, in rank order.

    ``m_r`` may differ between workers (zero included); rows are padded to the longest
    on the wire, so the transient memory is ``world * max_r(m_r) * k * 8`` bytes.
    """
    import torch
    import torch.distributed as dist

    if rows.dtype != np.int64 or rows.ndim != 2:
        raise TypeError(f"all_gather_rows takes a 2-D int64 array, got {rows.dtype} {rows.shape}")
    world = group_size(group)
    if world == 1:
        return rows.copy()
    sizes = torch.zeros(world, dtype=torch.int64)
    work = dist.all_gather_single(
        sizes, torch.tensor([rows.shape[0]], dtype=torch.int64), group=group, async_op=True
    )
    _wait(work, "all_gather (sizes)", group, timeout)
    longest = int(sizes.max())
    padded = torch.zeros((longest, rows.shape[1]), dtype=torch.int64)
    padded[: rows.shape[0]] = torch.from_numpy(np.ascontiguousarray(rows))
    parts = [torch.empty_like(padded) for _ in range(world)]
    _wait(dist.all_gather(parts, padded, group=group, async_op=True), "all_gather", group, timeout)
    return np.concatenate(
        [part.numpy()[: int(n)] for part, n in zip(parts, sizes, strict=True)], axis=0
    )
