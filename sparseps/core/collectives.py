"""Worker-to-worker collectives over ``torch.distributed``, sized for sparse data.

The group is the job's workers': gloo, or in a ``--secure`` job sparseps' CURVE group
(:mod:`sparseps.runtime.curve_group`; :func:`sparseps.runtime.rendezvous.worker_backend`
chooses), so nothing here knows which. Servers are not in this group. With no process group initialised (or a group of one)
every function degenerates to the local value, so single-worker code needs no branches.

Every function takes ``timeout`` (seconds): the trainer passes
``Strategy.collective_timeout``, so a worker that died or hangs turns into a
:class:`~sparseps.errors.DeadlineError` naming that setting instead of a silent hang.
``None`` leaves the process group's own limit (``SPARSEPS_COLLECTIVE_TIMEOUT_S``).

Every collective this process issues is counted by operation (:func:`counts`): sync mode's
collectives per step are a figure the tests pin and the benchmarks report.

Before a timeout is raised, the stacks of every role of the job are dumped
(:func:`sparseps.core.deadline.wait_collective`, in a launched job) and the error names
the folder: who was stuck where when this worker gave up.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
import torch.distributed as dist

from ..observe.diagnose import diagnosed
from .deadline import wait_collective

__all__ = [
    "all_gather_arrays",
    "all_reduce_sum",
    "all_to_all_rows",
    "barrier",
    "broadcast_array",
    "counts",
    "diagnosed",
    "world_size",
]

SETTING = "Strategy.collective_timeout"

_counts: Counter[str] = Counter()  # collectives issued by this process, by operation


def counts() -> dict[str, int]:
    """How many collectives this process has issued, by operation (a copy; with a group
    of one nothing is issued, so nothing is counted)."""
    return dict(_counts)


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _run(op: str, timeout: float | None, call) -> None:
    """``call(async_op)`` then wait, at most ``timeout`` seconds when given."""
    _counts[op] += 1
    if timeout is None:
        call(False)
        return
    wait_collective(
        call(True),
        op=f"worker {op}",
        timeout=timeout,
        rank=dist.get_rank(),
        setting=SETTING,
        hint=f"see the other workers' logs, or raise {SETTING}",
    )


def all_reduce_sum(array: np.ndarray, *, timeout: float | None = None) -> np.ndarray:
    """Element-wise sum over workers (float64/float32/int64 arrays)."""
    if world_size() == 1:
        return array
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    _run(
        "all_reduce",
        timeout,
        lambda a: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=a),
    )
    return tensor.numpy()


def broadcast_array(array: np.ndarray, src: int = 0, *, timeout: float | None = None) -> np.ndarray:
    """Every worker gets ``src``'s copy of ``array`` (same shape and dtype everywhere)."""
    if world_size() == 1:
        return array
    tensor = torch.from_numpy(np.ascontiguousarray(array).copy())
    _run("broadcast", timeout, lambda a: dist.broadcast(tensor, src=src, async_op=a))
    return tensor.numpy()


def all_gather_arrays(
    array: np.ndarray, *, sizes: np.ndarray | None = None, timeout: float | None = None
) -> list[np.ndarray]:
    """Gather a first-axis-variable array from every worker (rank order).

    Arrays of the same dtype and trailing shape; sizes may differ (padded on the wire).
    uint64 travels as int64 (torch has no uint64 collectives) and is viewed back.
    Two collectives (the sizes, then the padded arrays), one when the caller already
    knows every worker's first-axis size (``sizes``, in rank order).

    Raises:
        ValueError: ``sizes`` does not give this worker's own size (the workers would
            read each other's arrays wrong).
    """
    if world_size() == 1:
        return [array]
    dtype = array.dtype
    wire = array.view(np.int64) if dtype == np.uint64 else array
    rank = dist.get_rank()
    if sizes is None:
        wire_sizes = torch.zeros(world_size(), dtype=torch.int64)
        mine = torch.tensor([wire.shape[0]], dtype=torch.int64)
        _run(
            "all_gather",
            timeout,
            lambda a: dist.all_gather_single(wire_sizes, mine, async_op=a),
        )
        known = [int(n) for n in wire_sizes.tolist()]
    else:
        known = [int(n) for n in sizes]
        if known[rank] != wire.shape[0]:
            raise ValueError(
                f"all_gather: worker {rank} announced {known[rank]} rows but sends {wire.shape[0]}"
            )
    longest = max(known)
    padded = np.zeros((longest, *wire.shape[1:]), dtype=wire.dtype)
    padded[: wire.shape[0]] = wire
    out = [torch.empty_like(torch.from_numpy(padded)) for _ in range(world_size())]
    source = torch.from_numpy(padded)
    _run("all_gather", timeout, lambda a: dist.all_gather(out, source, async_op=a))
    parts = [o.numpy()[:n] for o, n in zip(out, known, strict=True)]
    return [p.view(np.uint64) if dtype == np.uint64 else p for p in parts]


def all_to_all_rows(
    array: np.ndarray,
    send_counts: np.ndarray,
    recv_counts: np.ndarray | None = None,
    *,
    timeout: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Personalised exchange: rows ``[sum(send_counts[:j]), ...)`` of ``array`` go to worker j.

    ``array`` is grouped by destination (rank order) with ``send_counts[j]`` rows for
    worker j; returns ``(received, recv_counts)``: the rows every worker sent here,
    concatenated in rank order, and how many came from each. uint64 travels as int64.
    Two collectives (the counts, then the rows; ``all_to_all_single``), one when
    the caller knows ``recv_counts`` (e.g. the reply to an earlier exchange).
    """
    if world_size() == 1:
        return array, np.asarray(send_counts, np.int64)
    dtype = array.dtype
    wire = np.ascontiguousarray(array.view(np.int64) if dtype == np.uint64 else array)
    sent = torch.from_numpy(np.ascontiguousarray(send_counts, np.int64))
    if recv_counts is None:
        counts = torch.empty_like(sent)
        _run("all_to_all", timeout, lambda a: dist.all_to_all_single(counts, sent, async_op=a))
    else:
        counts = torch.from_numpy(np.ascontiguousarray(recv_counts, np.int64))
    recv = counts.tolist()
    out = torch.empty((sum(recv), *wire.shape[1:]), dtype=torch.from_numpy(wire[:0]).dtype)
    source = torch.from_numpy(wire)
    _run(
        "all_to_all",
        timeout,
        lambda a: dist.all_to_all_single(out, source, recv, sent.tolist(), async_op=a),
    )
    received = out.numpy()
    return (received.view(np.uint64) if dtype == np.uint64 else received), counts.numpy()


def barrier(*, timeout: float | None = None) -> None:
    if world_size() > 1:
        _run("barrier", timeout, lambda a: dist.barrier(async_op=a))
