"""The workers' ``torch.distributed`` process group of a ``--secure`` job, over CURVE.

gloo's TCP pairs can be neither encrypted nor authenticated (torch is built without
gloo's TLS transport), so a secure job's workers form their group with this backend
instead (:func:`sparseps.runtime.rendezvous.worker_backend` picks it; plain jobs keep
gloo for its speed). Every byte travels over :class:`~sparseps.rpc.mesh.Mesh`: CURVE
links admitted by the job's one-key ZAP handler, the same transport as the servers'.

:class:`CurveGroup` is a ``ProcessGroup`` written in Python (torch's documented extension
point, ``Backend.register_backend``); ``dist.all_reduce`` and friends dispatch to its
methods, which check their tensors (dense, contiguous, on the CPU, as gloo requires),
number the collective and queue it; one thread runs the collectives in that order and
completes each :class:`CurveWork`. Point-to-point receives complete on arrival, so any
order of ``isend``/``irecv`` works. How each collective moves its tensors (direct
algorithms, whole tensors as one frame each, every rank ending with the same bits) is
:mod:`sparseps.runtime.curve_ops`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..rpc.mesh import P2P, GroupError, Mesh
from ..rpc.security import Security
from .curve_ops import Collectives, payload, pieces, reduction, typed

__all__ = ["BACKEND", "CurveGroup", "CurveWork", "GroupOptions"]

log = logging.getLogger(__name__)

BACKEND = "sparseps_curve"  # the name registered with torch.distributed
_MAX_QUEUED = 1024  # collectives issued and not yet run
_JOIN_S = 5.0  # shutting down: how long a collective still running may take


@dataclass(frozen=True)
class GroupOptions:
    """What a :class:`CurveGroup` needs beyond torch's arguments: the job's keys and the
    IP address this rank listens on (the interface the other workers reach)."""

    security: Security
    host: str


class CurveWork(dist._Work):
    """One collective or point-to-point op of a :class:`CurveGroup`.

    ``wait(timeout)`` waits at most ``timeout`` (the group's timeout when none); past it
    the group is aborted (its peers' state is unknown, as with gloo) and a
    :class:`~sparseps.rpc.mesh.GroupError` saying "timed out" is raised.
    """

    def __init__(self, group: CurveGroup, op: str, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._group, self.op, self._result = group, op, result
        self._done = threading.Event()
        self._error: str | None = None
        self._future: torch.futures.Future = torch.futures.Future()

    def _finish(self, error: str | None = None) -> None:
        self._error = error
        self._done.set()
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(GroupError(error))

    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if timeout else self._group.timeout_s
        if not self._done.wait(seconds):
            rank = self._group.rank()
            # the peers' state is unknown: later collectives fail at once, saying why
            self._group.abort_with(f"unusable since {self.op} on rank {rank} ran past its "
                                   f"{seconds:.0f} s limit")  # fmt: skip
            raise GroupError(f"secure group: {self.op} on rank {rank} timed out after "
                             f"{seconds:.0f} s (a worker did not take part)")  # fmt: skip
        if self._error is not None:
            raise GroupError(self._error)
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self):
        return None if self._error is None else GroupError(self._error)

    def get_future(self) -> torch.futures.Future:
        return self._future

    def result(self) -> list[torch.Tensor]:
        return self._result


Algorithm = Callable[[int, float], None]  # (collective number, deadline) -> None


class CurveGroup(dist.ProcessGroup):
    """A process group whose every message goes over the job's CURVE mesh.

    Args:
        store: the group's store (torch's prefix of the job's CURVE store).
        rank, size: this rank and the group's size.
        timeout: the limit of the rendezvous and of every collective's wait.
        options: the job's keys and the address to listen on.

    Raises:
        GroupError: the mesh could not be formed (see :class:`~sparseps.rpc.mesh.Mesh`).
    """

    def __init__(
        self, store, rank: int, size: int, timeout: timedelta, options: GroupOptions
    ) -> None:
        # (rank, size): this torch's (store, rank, size) constructor makes no Python subclass
        super().__init__(rank, size)  # type: ignore[call-arg]
        self.timeout_s = timeout.total_seconds()
        self._mesh = None
        if size > 1:
            self._mesh = Mesh(
                store, rank, size, security=options.security, host=options.host,
                timeout_s=self.timeout_s,
            )  # fmt: skip
        self._run_on = Collectives(self._mesh, rank, size)
        self._seq = 0
        self._closed = False
        self._issue = threading.Lock()  # numbers and queues collectives in one order
        self._ops: queue.Queue = queue.Queue(maxsize=_MAX_QUEUED)
        self._thread = threading.Thread(target=self._run, name="sparseps-group", daemon=True)
        self._thread.start()
        log.info("secure worker group: rank %d of %d%s", rank, size,
                 f", listening on {self._mesh.address} (CURVE)" if self._mesh else "")  # fmt: skip

    def getBackendName(self) -> str:
        return BACKEND

    # -- running collectives in order ------------------------------------------------------

    def _submit(self, op: str, algorithm: Algorithm, result: list[torch.Tensor]) -> CurveWork:
        work = CurveWork(self, op, result)
        with self._issue:
            if self._closed:
                work._finish(f"{op}: the secure group of rank {self.rank()} was shut down")
                return work
            seq, self._seq = self._seq, self._seq + 1
            self._ops.put((work, seq, algorithm))
        return work

    def _run(self) -> None:
        while True:
            item = self._ops.get()
            if item is None:
                return
            work, seq, algorithm = item
            try:
                if self._mesh is not None:
                    self._mesh.check()
                algorithm(seq, time.monotonic() + self.timeout_s)
            except Exception as exc:
                work._finish(f"{work.op} (collective {seq} of rank {self.rank()}): {exc}")
            else:
                work._finish()

    # -- collectives: checked here, run by curve_ops.Collectives ----------------------------

    def allreduce(self, tensors, opts=None):
        tensor = _one("all_reduce", tensors)
        flat, reduce = tensor.view(-1), reduction("all_reduce", opts)
        return self._submit(
            "all_reduce", lambda seq, end: self._run_on.all_reduce(seq, end, flat, reduce), [tensor]
        )

    def broadcast(self, tensors, opts=None):
        tensor = _one("broadcast", tensors)
        flat, root = tensor.view(-1), 0 if opts is None else opts.rootRank
        return self._submit(
            "broadcast", lambda seq, end: self._run_on.broadcast(seq, end, flat, root), [tensor]
        )

    def allgather(self, output_tensors, input_tensors, opts=None):
        source = _one("all_gather", input_tensors)
        outs = [out.detach() for out in output_tensors[0]]
        if len(outs) != self.size():
            raise ValueError(f"all_gather: {len(outs)} output tensors for {self.size()} ranks")
        for out in outs:
            _check("all_gather", out, like=source)
        return self._gather_all("all_gather", source, [o.view(-1) for o in outs], outs)

    def all_gather_single(self, output, input, opts=None):
        source = _one("all_gather_single", [input])
        output = _one("all_gather_single", [output])
        if output.numel() != source.numel() * self.size() or output.dtype != source.dtype:
            raise ValueError("all_gather_single: the output must hold size x the input "
                             f"({source.numel()} x {self.size()} {source.dtype})")  # fmt: skip
        n, out = source.numel(), output.view(-1)
        parts = [out[j * n : (j + 1) * n] for j in range(self.size())]
        return self._gather_all("all_gather_single", source, parts, [output])

    _allgather_base = all_gather_single

    def _gather_all(self, op: str, source, parts, result) -> CurveWork:
        flat = source.view(-1)
        return self._submit(
            op, lambda seq, end: self._run_on.all_gather(seq, end, flat, parts), result
        )

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        input, output = _one("all_to_all_single", [input]), _one("all_to_all_single", [output])
        sends = pieces("input", input, input_split_sizes, self.size())
        recvs = pieces("output", output, output_split_sizes, self.size())
        return self._submit(
            "all_to_all_single",
            lambda seq, end: self._run_on.all_to_all(seq, end, sends, recvs),
            [output],
        )

    def barrier(self, opts=None):
        return self._submit("barrier", self._run_on.barrier, [])

    def reduce(self, tensors, opts=None):
        tensor = _one("reduce", tensors)
        flat, reduce = tensor.view(-1), reduction("reduce", opts)
        root = 0 if opts is None else opts.rootRank
        return self._submit(
            "reduce", lambda seq, end: self._run_on.reduce(seq, end, flat, reduce, root), [tensor]
        )

    def gather(self, output_tensors, input_tensors, opts=None):
        flat = _one("gather", input_tensors).view(-1)
        root = 0 if opts is None else opts.rootRank
        outs = [o.detach().view(-1) for o in output_tensors[0]] if self.rank() == root else []
        return self._submit(
            "gather", lambda seq, end: self._run_on.gather(seq, end, flat, outs, root), outs
        )

    def scatter(self, output_tensors, input_tensors, opts=None):
        target = _one("scatter", output_tensors)
        root = 0 if opts is None else opts.rootRank
        ins = [t.detach().view(-1) for t in input_tensors[0]] if self.rank() == root else []
        flat = target.view(-1)
        return self._submit(
            "scatter", lambda seq, end: self._run_on.scatter(seq, end, flat, ins, root), [target]
        )

    # -- point to point ------------------------------------------------------------------

    def send(self, tensors, dstRank: int, tag: int):
        tensor = _one("send", tensors)
        if self._mesh is None:
            raise ValueError("send: a group of one has no peer")
        # a private copy: the work completes at once, the caller may write its tensor
        self._mesh.send(dstRank, P2P, 0, 0, tag, payload(tensor.clone()))
        work = CurveWork(self, "send", [tensor])
        work._finish()
        return work

    def recv(self, tensors, srcRank: int, tag: int):
        tensor = _one("recv", tensors)
        if self._mesh is None:
            raise ValueError("recv: a group of one has no peer")
        work = CurveWork(self, "recv", [tensor])
        flat = tensor.view(-1)

        def arrived(frame, error) -> None:
            if error is not None:
                work._finish(str(error))
                return
            try:
                flat.copy_(typed(frame, flat, f"recv from {srcRank}"))
            except GroupError as exc:
                work._finish(str(exc))
            else:
                work._finish()

        self._mesh.post_recv(srcRank, tag, arrived)
        return work

    # -- lifecycle -----------------------------------------------------------------------

    def abort(self) -> None:
        self._close(abort=True)

    def shutdown(self) -> None:
        self._close(abort=False)

    def _close(self, *, abort: bool) -> None:
        """Stop the collective thread and close the mesh (idempotent). A collective still
        running (nobody waited for it) fails."""
        with self._issue:
            if self._closed:
                return
            self._closed = True
            self._ops.put(None)
        if not abort:
            self._thread.join(timeout=_JOIN_S)
        if abort or self._thread.is_alive():
            self.abort_with("the group was shut down while a collective ran")
            self._thread.join(timeout=_JOIN_S)
        if self._mesh is not None:
            self._mesh.close()

    def abort_with(self, why: str) -> None:
        """Break the group (a wait timed out): every collective, now and later, fails."""
        if self._mesh is not None:
            self._mesh.abort(why)


def _check(op: str, tensor: torch.Tensor, *, like: torch.Tensor | None = None) -> None:
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        raise ValueError(f"{op}: the secure group takes dense CPU tensors, got "
                         f"{tensor.layout} on {tensor.device}")  # fmt: skip
    if not tensor.is_contiguous():
        raise ValueError(f"{op}: tensors must be contiguous")
    if like is not None and (tensor.numel() != like.numel() or tensor.dtype != like.dtype):
        raise ValueError(f"{op}: every tensor must match the input ({like.numel()} {like.dtype})")


def _one(op: str, tensors) -> torch.Tensor:
    """The one tensor of a call, detached (collectives write into parameters too)."""
    tensors = list(tensors)
    if len(tensors) != 1:
        raise ValueError(f"{op}: the secure group takes one tensor per call, got {len(tensors)}")
    _check(op, tensors[0])
    return tensors[0].detach()
