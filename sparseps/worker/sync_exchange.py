"""Sync mode's exchange of sparse gradients: every table of a step in one all-gather.

Each worker packs, per table, its keys, gradients, shows and clicks into one byte buffer
(``[n: int64][keys: n x uint64][grads: n x dim float32][shows: n][clicks: n]`` per table,
tables by name), and one all-gather moves every worker's buffer: two collectives per step
for all tables, where gathering each array apart took eight per table. Every worker then
holds every worker's contribution, in rank order, exactly as the per-array gathers gave it.
"""

from __future__ import annotations

import numpy as np

from ..core import collectives

__all__ = ["gather_sparse_grads"]


def _pack(grads: list) -> np.ndarray:
    parts = []
    for _, keys, grad, shows, clicks in grads:
        parts += [
            np.array([keys.size], np.int64).view(np.uint8),
            np.ascontiguousarray(keys, np.uint64).view(np.uint8),
            np.ascontiguousarray(grad, np.float32).reshape(-1).view(np.uint8),
            np.ascontiguousarray(shows, np.float32).view(np.uint8),
            np.ascontiguousarray(clicks, np.float32).view(np.uint8),
        ]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _unpack(buffer: np.ndarray, dims: list[int]) -> list[tuple]:
    """``[(keys, grads, shows, clicks)]`` per table from one worker's buffer."""
    out, at = [], 0
    mismatch = RuntimeError(
        f"sync mode: a worker's gradient buffer of {buffer.size} bytes does not hold its "
        f"{len(dims)} tables; the workers' models have different sparse tables"
    )

    def take(nbytes: int, dtype) -> np.ndarray:
        nonlocal at
        if at + nbytes > buffer.size:
            raise mismatch
        # a copy: the slices of the byte buffer are not aligned for their dtype
        values = buffer[at : at + nbytes].copy().view(dtype)
        at += nbytes
        return values

    for dim in dims:
        n = int(take(8, np.int64)[0])
        keys = take(8 * n, np.uint64)
        grad = take(4 * n * dim, np.float32).reshape(n, dim)
        out.append((keys, grad, take(4 * n, np.float32), take(4 * n, np.float32)))
    if at != buffer.size:
        raise mismatch
    return out


def gather_sparse_grads(grads: list, *, timeout: float | None) -> list[tuple]:
    """Every worker's ``(table, keys, grads, shows, clicks)`` of each table, concatenated
    in rank order, tables sorted by name (the same on every worker)."""
    grads = sorted(grads, key=lambda g: g[0])
    dims = [int(g[2].shape[1]) for g in grads]
    workers = [
        _unpack(b, dims) for b in collectives.all_gather_arrays(_pack(grads), timeout=timeout)
    ]
    return [
        (table, *(np.concatenate([w[t][i] for w in workers]) for i in range(4)))
        for t, (table, *_) in enumerate(grads)
    ]
