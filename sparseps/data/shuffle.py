"""Exchange samples among workers over ``torch.distributed`` (gloo) for global_shuffle.

Each worker packs the samples bound for each peer into one byte buffer (columnar:
labels, dense, ids, extra labels, per-slot offsets and values), all workers learn every buffer size
with one ``all_gather``, then buffers travel point to point (``isend``/``irecv``, all in
flight at once, so no ordering can deadlock). Every wait has a timeout.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DeadlineError, UnavailableError
from .schema import Batch, Slot

if TYPE_CHECKING:
    from torch.distributed import Work

__all__ = ["exchange", "group_size", "pack", "unpack"]


def group_size() -> int:
    """Workers in the torch.distributed group (1 when none is initialised)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _started(work: Work | None) -> Work:
    """The pending work of an async op (torch returns None only to a rank outside the group)."""
    assert work is not None
    return work


def _pad8(raw: bytes | memoryview) -> list:
    return [raw, b"\0" * (-len(raw) % 8)]


def pack(batch: Batch) -> np.ndarray:
    """The samples of ``batch`` as one uint8 buffer (sections 8-byte aligned).

    Header (int64): samples, dense columns, extra label columns (-1: ``extra_labels`` is
    None), slots, then each slot's number of ids.
    """
    n, d = batch.dense.shape
    names = list(batch.slots)
    extra = batch.extra_labels
    k = -1 if extra is None else extra.shape[1]
    sizes = (batch.slots[s].values.size for s in names)
    header = np.array([n, d, k, len(names), *sizes], np.int64)
    parts = [header.tobytes()]
    arrays = (batch.label, batch.dense, batch.ids) + (() if extra is None else (extra,))
    for array in arrays:
        parts += _pad8(np.ascontiguousarray(array).tobytes())
    for name in names:
        parts.append(np.ascontiguousarray(batch.slots[name].offsets).tobytes())
        parts.append(np.ascontiguousarray(batch.slots[name].values).tobytes())
    # writable (a bytearray, joined in place): torch.from_numpy warns on a read-only buffer
    return np.frombuffer(bytearray().join(parts), np.uint8)


def unpack(buffer: np.ndarray, names: list[str]) -> Batch:
    """Inverse of :func:`pack` (slot names in the packing order)."""
    raw = buffer.tobytes()
    n, d, k, s = (int(v) for v in np.frombuffer(raw, np.int64, 4))
    nnz = np.frombuffer(raw, np.int64, s, 32)
    pos = 32 + 8 * s

    def take(dtype, count):
        nonlocal pos
        out = np.frombuffer(raw, dtype, count, pos).copy()
        pos += -(-out.nbytes // 8) * 8
        return out

    label = take(np.float32, n)
    dense = take(np.float32, n * d).reshape(n, d)
    ids = take(np.int64, n)
    extra = None if k < 0 else take(np.float32, n * k).reshape(n, k)
    slots = {}
    for name, count in zip(names, nnz, strict=True):
        offsets = take(np.int64, n + 1)
        slots[name] = Slot(take(np.uint64, int(count)), offsets)
    return Batch(label, dense, slots, ids, extra)


def exchange(batch: Batch, destination: np.ndarray, *, timeout: float) -> Batch:
    """Send sample ``i`` to worker ``destination[i]``; return what this worker receives.

    Received samples are in peer-rank order (the caller shuffles them).

    Raises:
        DeadlineError: a peer did not complete the exchange within ``timeout`` seconds.
        UnavailableError: the process group failed (a peer died).
    """
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    order = np.argsort(destination, kind="stable")
    counts = np.bincount(destination, minlength=world)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    ordered = batch.take(order)
    payloads = [pack(ordered.slice(int(bounds[q]), int(bounds[q + 1]))) for q in range(world)]
    names = list(batch.slots)
    sizes = torch.tensor([p.size for p in payloads], dtype=torch.int64)
    everyone = torch.zeros(world * world, dtype=torch.int64)
    wait = datetime.timedelta(seconds=timeout)
    try:
        _started(dist.all_gather_single(everyone, sizes, async_op=True)).wait(wait)
        incoming = everyone.view(world, world)[:, rank].tolist()
        works: list[Work] = []
        buffers = {}
        for peer in range(world):
            if peer == rank:
                continue
            if payloads[peer].size:
                works.append(_started(dist.isend(torch.from_numpy(payloads[peer]), dst=peer)))
            if incoming[peer]:
                buffers[peer] = torch.empty(incoming[peer], dtype=torch.uint8)
                works.append(_started(dist.irecv(buffers[peer], src=peer)))
        for w in works:
            w.wait(wait)
    except RuntimeError as exc:
        text = str(exc)
        if "imeout" in text or "imed out" in text:
            raise DeadlineError(
                f"global_shuffle: exchange with the other workers did not finish in {timeout:.0f} s "
                f"({text.splitlines()[0] if text else 'timeout'}); raise global_shuffle(timeout=...)",
                op="global_shuffle", role="worker", rank=rank, seconds=timeout, setting="timeout",
            ) from exc  # fmt: skip
        raise UnavailableError(
            f"global_shuffle: the worker process group failed: {text.splitlines()[0] if text else exc!r}",
            op="global_shuffle", role="worker", rank=rank,
        ) from exc  # fmt: skip
    parts = []
    for peer in range(world):
        if peer == rank:
            parts.append(ordered.slice(int(bounds[rank]), int(bounds[rank + 1])))
        elif peer in buffers:
            parts.append(unpack(buffers[peer].numpy(), names))
    return Batch.concat(parts)
