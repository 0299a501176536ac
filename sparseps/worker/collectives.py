"""Worker-to-worker collectives over ``torch.distributed`` (gloo), sized for sparse data.

Servers are not in this group. With no process group initialised (or a group of one)
every function degenerates to the local value, so single-worker code needs no branches.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["all_gather_arrays", "all_reduce_sum", "barrier", "broadcast_array", "world_size"]


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_sum(array: np.ndarray) -> np.ndarray:
    """Element-wise sum over workers (float64/float32/int64 arrays)."""
    if world_size() == 1:
        return array
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.numpy()


def broadcast_array(array: np.ndarray, src: int = 0) -> np.ndarray:
    """Every worker gets ``src``'s copy of ``array`` (same shape and dtype everywhere)."""
    if world_size() == 1:
        return array
    tensor = torch.from_numpy(np.ascontiguousarray(array).copy())
    dist.broadcast(tensor, src=src)
    return tensor.numpy()


def all_gather_arrays(array: np.ndarray) -> list[np.ndarray]:
    """Gather a first-axis-variable array from every worker (rank order).

    Arrays of the same dtype and trailing shape; sizes may differ (padded on the wire).
    uint64 travels as int64 (torch has no uint64 collectives) and is viewed back.
    """
    if world_size() == 1:
        return [array]
    dtype = array.dtype
    wire = array.view(np.int64) if dtype == np.uint64 else array
    sizes = torch.zeros(world_size(), dtype=torch.int64)
    dist.all_gather_into_tensor(sizes, torch.tensor([wire.shape[0]], dtype=torch.int64))
    longest = int(sizes.max())
    padded = np.zeros((longest, *wire.shape[1:]), dtype=wire.dtype)
    padded[: wire.shape[0]] = wire
    out = [torch.empty_like(torch.from_numpy(padded)) for _ in range(world_size())]
    dist.all_gather(out, torch.from_numpy(padded))
    parts = [o.numpy()[: int(n)] for o, n in zip(out, sizes, strict=True)]
    return [p.view(np.uint64) if dtype == np.uint64 else p for p in parts]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
