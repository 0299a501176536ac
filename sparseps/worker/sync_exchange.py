"""Sync mode's exchange of sparse gradients: every table of a step in one all-gather.

Each worker packs, per table, its keys, gradients, shows and clicks into one byte buffer
(``[n: int64][keys: n x uint64][grads: n x dim float32][shows: n][clicks: n]`` per table,
tables by name), and one all-gather moves every worker's buffer, where gathering each
array apart took eight collectives per table. A buffer's size is known before the step
computes (:func:`packed_size` of the batch's unique keys per table), so sync mode sends it
with the step's header and the all-gather needs no exchange of sizes of its own. Every
worker then holds every worker's contribution, in rank order, exactly as the per-array
gathers gave it.
"""

from __future__ import annotations

import numpy as np

from ..core import collectives

__all__ = ["exchange_headers", "gather_sparse_grads", "packed_size", "step_header"]


def packed_size(keys: list[int], dims: list[int]) -> int:
    """Bytes of the buffer of tables with ``keys[t]`` keys of ``dims[t]`` floats each."""
    return sum(8 + n * (8 + 4 * dim + 4 + 4) for n, dim in zip(keys, dims, strict=True))


def step_header(item, dims: dict[str, int]) -> np.ndarray:
    """``[[has data, batch size, buffer bytes]]`` of this worker's next step.

    ``item``: ``(batch, {table: lookup}, rows)``, or None once this worker's data ran out
    (it still takes part, with no keys); ``dims``: ``{table: dim}`` of every table the
    model reads (the tables of the trainer's gradients, each lookup's keys one row each).
    """
    if item is None:
        has_data, batch_size, keys = 0, 0, [0] * len(dims)
    else:
        lookups = item[1]
        has_data, batch_size = 1, len(item[0])
        keys = [lookups[t].keys.size if t in lookups else 0 for t in dims]
    size = packed_size(keys, list(dims.values()))
    return np.array([[has_data, batch_size, size]], np.int64)


def exchange_headers(header: np.ndarray, *, timeout: float | None) -> tuple[int, int, np.ndarray]:
    """One all-gather of every worker's :func:`step_header`.

    Returns:
        ``(workers with data, global batch size, every worker's buffer bytes)``: whether
        the step happens (0: every worker's data ran out), the loss's denominator, and
        the sizes :func:`gather_sparse_grads` then needs.
    """
    world = collectives.world_size()
    every = np.concatenate(
        collectives.all_gather_arrays(header, sizes=np.ones(world, np.int64), timeout=timeout)
    )
    return int(every[:, 0].sum()), int(every[:, 1].sum()), every[:, 2].copy()


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


def gather_sparse_grads(
    grads: list, *, sizes: np.ndarray | None = None, timeout: float | None
) -> list[tuple]:
    """Every worker's ``(table, keys, grads, shows, clicks)`` of each table, concatenated
    in rank order, tables sorted by name (the same on every worker).

    ``sizes``: every worker's buffer size in bytes (rank order) when the workers have
    announced them (one collective); without it the sizes are exchanged first (two).
    """
    grads = sorted(grads, key=lambda g: g[0])
    dims = [int(g[2].shape[1]) for g in grads]
    buffers = collectives.all_gather_arrays(_pack(grads), sizes=sizes, timeout=timeout)
    workers = [_unpack(b, dims) for b in buffers]
    return [
        (table, *(np.concatenate([w[t][i] for w in workers]) for i in range(4)))
        for t, (table, *_) in enumerate(grads)
    ]
