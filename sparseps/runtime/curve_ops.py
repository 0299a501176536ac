"""The secure group's collectives: how each one moves tensors over the CURVE mesh.

:class:`Collectives` holds one algorithm per collective for one rank of a
:class:`~sparseps.runtime.curve_group.CurveGroup`; the group numbers the collectives and
runs them in that order on one thread, so here each is straight-line code over
:class:`~sparseps.rpc.mesh.Mesh` (send a tensor to a peer, take what a peer sent for
step ``s`` of collective ``seq``). The algorithms are direct, for a job's handful of
workers (each costs at most two rounds of latency):

- all-reduce: with two workers, or at most :data:`SMALL_BYTES`, every rank sends its
  tensor to every other and reduces them all in rank order; otherwise a reduce-scatter
  (rank ``j`` reduces chunk ``j`` of every rank's tensor, in rank order) then an
  all-gather of the reduced chunks. Both give every rank the same bits: each element is
  reduced in rank order, once;
- broadcast, all-gather, all-to-all, gather, scatter, reduce: each piece sent straight
  to the rank that needs it; barrier: an empty message from every rank to every other.

Tensors travel as one frame each, without a copy: a collective returns (and the caller
may write its tensors) only once zmq no longer reads them (the messages' trackers).
Received payloads are checked against the size this rank expects (workers that call
collectives of different sizes get an error, not garbage).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..rpc.mesh import COLLECTIVE, GroupError, Mesh

__all__ = ["SMALL_BYTES", "Collectives", "payload", "pieces", "reduction", "typed"]

SMALL_BYTES = 64 << 10  # all-reduce: up to this, one round (everyone sends everything)
ALLREDUCE, BROADCAST, ALLGATHER, ALLTOALL, BARRIER, REDUCE, GATHER, SCATTER = range(1, 9)

Reduce = Callable[[torch.Tensor, torch.Tensor], object]  # (accumulator, part): in place
_REDUCE: dict[object, Reduce] = {
    dist.ReduceOp.SUM: torch.Tensor.add_,
    dist.ReduceOp.PRODUCT: torch.Tensor.mul_,
    dist.ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    dist.ReduceOp.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
    dist.ReduceOp.BAND: torch.Tensor.bitwise_and_,
    dist.ReduceOp.BOR: torch.Tensor.bitwise_or_,
    dist.ReduceOp.BXOR: torch.Tensor.bitwise_xor_,
}


class Collectives:
    """One rank's collectives over ``mesh`` (None: a group of one).

    Each method runs collective number ``seq`` on flat, contiguous tensors, waiting for
    the peers until ``deadline`` (``time.monotonic()``), and writes its result in place.

    Raises (every method):
        GroupError: a peer is gone, sent a payload of another size or ran another
            collective as number ``seq``, or the deadline passed ("timed out").
    """

    def __init__(self, mesh: Mesh | None, rank: int, size: int) -> None:
        self.mesh, self.rank, self.size = mesh, rank, size
        self.peers = [] if mesh is None else mesh.peers

    def all_reduce(self, seq: int, deadline: float, flat: torch.Tensor, reduce: Reduce) -> None:
        if self.size <= 2 or flat.numel() * flat.element_size() <= SMALL_BYTES:
            trackers = [self._send(p, ALLREDUCE, 0, seq, flat) for p in self.peers]
            parts = [flat if j == self.rank else self._take(seq, 0, j, ALLREDUCE, deadline, flat)
                     for j in range(self.size)]  # fmt: skip
            total = _reduced(parts, reduce)
            self._finished(trackers, deadline)
            flat.copy_(total)
            return
        bounds = [flat.numel() * j // self.size for j in range(self.size + 1)]
        chunks = [flat[bounds[j] : bounds[j + 1]] for j in range(self.size)]
        trackers = [self._send(p, ALLREDUCE, 0, seq, chunks[p]) for p in self.peers]
        mine = chunks[self.rank]
        parts = [mine if j == self.rank else self._take(seq, 0, j, ALLREDUCE, deadline, mine)
                 for j in range(self.size)]  # fmt: skip
        total = _reduced(parts, reduce)  # a private buffer: sent as is
        for peer in self.peers:
            self._send(peer, ALLREDUCE, 1, seq, total)
        self._finished(trackers, deadline)
        for peer in self.peers:
            chunks[peer].copy_(self._take(seq, 1, peer, ALLREDUCE, deadline, chunks[peer]))
        mine.copy_(total)

    def broadcast(self, seq: int, deadline: float, flat: torch.Tensor, root: int) -> None:
        if self.rank == root:
            self._finished([self._send(p, BROADCAST, 0, seq, flat) for p in self.peers], deadline)
        else:
            flat.copy_(self._take(seq, 0, root, BROADCAST, deadline, flat))

    def all_gather(
        self, seq: int, deadline: float, flat: torch.Tensor, parts: list[torch.Tensor]
    ) -> None:
        """``parts[j]`` gets rank ``j``'s ``flat``."""
        trackers = [self._send(p, ALLGATHER, 0, seq, flat) for p in self.peers]
        parts[self.rank].copy_(flat)
        for peer in self.peers:
            parts[peer].copy_(self._take(seq, 0, peer, ALLGATHER, deadline, flat))
        self._finished(trackers, deadline)

    def all_to_all(
        self, seq: int, deadline: float, sends: list[torch.Tensor], recvs: list[torch.Tensor]
    ) -> None:
        """``sends[j]`` goes to rank ``j``; ``recvs[j]`` gets what rank ``j`` sent here."""
        trackers = [self._send(p, ALLTOALL, 0, seq, sends[p]) for p in self.peers]
        recvs[self.rank].copy_(sends[self.rank])
        for peer in self.peers:
            recvs[peer].copy_(self._take(seq, 0, peer, ALLTOALL, deadline, recvs[peer]))
        self._finished(trackers, deadline)

    def barrier(self, seq: int, deadline: float) -> None:
        empty = torch.empty(0, dtype=torch.uint8)
        for peer in self.peers:
            self._send(peer, BARRIER, 0, seq, empty)
        for peer in self.peers:
            self._take(seq, 0, peer, BARRIER, deadline, empty)

    def reduce(
        self, seq: int, deadline: float, flat: torch.Tensor, reduce: Reduce, root: int
    ) -> None:
        if self.rank != root:
            self._finished([self._send(root, REDUCE, 0, seq, flat)], deadline)
            return
        parts = [flat if j == root else self._take(seq, 0, j, REDUCE, deadline, flat)
                 for j in range(self.size)]  # fmt: skip
        flat.copy_(_reduced(parts, reduce))

    def gather(
        self, seq: int, deadline: float, flat: torch.Tensor, outs: list[torch.Tensor], root: int
    ) -> None:
        if self.rank != root:
            self._finished([self._send(root, GATHER, 0, seq, flat)], deadline)
            return
        for j, out in enumerate(outs):
            out.copy_(flat if j == root else self._take(seq, 0, j, GATHER, deadline, flat))

    def scatter(
        self, seq: int, deadline: float, flat: torch.Tensor, ins: list[torch.Tensor], root: int
    ) -> None:
        if self.rank != root:
            flat.copy_(self._take(seq, 0, root, SCATTER, deadline, flat))
            return
        trackers = [self._send(p, SCATTER, 0, seq, ins[p]) for p in self.peers]
        flat.copy_(ins[root])
        self._finished(trackers, deadline)

    # -- the mesh ------------------------------------------------------------------------

    def _send(self, peer: int, op: int, step: int, seq: int, tensor: torch.Tensor):
        assert self.mesh is not None  # peers exist only with a mesh
        return self.mesh.send(peer, COLLECTIVE, op, step, seq, payload(tensor), track=True)

    def _take(self, seq: int, step: int, peer: int, op: int, deadline: float, like):
        """What ``peer`` sent for step ``step`` of collective ``seq``, as a flat tensor
        of ``like``'s dtype and size."""
        assert self.mesh is not None
        frame = self.mesh.take(seq, step, peer, op, deadline, f"collective {seq}")
        return typed(frame, like, f"collective {seq} from rank {peer}")

    @staticmethod
    def _finished(trackers, deadline: float) -> None:
        """Wait until zmq no longer reads the caller's tensors."""
        for tracker in trackers:
            if tracker is not None and not tracker.done:
                try:
                    tracker.wait(max(0.0, deadline - time.monotonic()))
                except Exception:
                    raise GroupError("sending timed out (zmq still holds a message)") from None


def reduction(op: str, opts) -> Reduce:
    """The in-place reduction ``opts.reduceOp`` names (SUM without options).

    Raises:
        ValueError: a reduction the group does not offer (AVG and PREMUL_SUM, as gloo).
    """
    wanted = dist.ReduceOp.SUM if opts is None else opts.reduceOp
    for reduce_op, reduce in _REDUCE.items():
        if wanted == reduce_op:
            return reduce
    raise ValueError(f"{op}: the secure group reduces with SUM, PRODUCT, MIN, MAX, BAND, BOR "
                     "or BXOR")  # fmt: skip


def pieces(what: str, tensor: torch.Tensor, splits, size: int) -> list[torch.Tensor]:
    """``tensor`` cut along its first axis by ``splits`` (even when empty), flat."""
    rows = tensor.size(0) if tensor.dim() else 1
    splits = list(splits) or [rows // size] * size
    if len(splits) != size or sum(splits) != rows:
        raise ValueError(f"all_to_all_single: {what} splits {splits} do not cut {rows} rows "
                         f"into {size} pieces")  # fmt: skip
    row = tensor.numel() // rows if rows else 0
    flat, out, start = tensor.view(-1), [], 0
    for n in splits:
        out.append(flat[start * row : (start + n) * row])
        start += n
    return out


def payload(tensor: torch.Tensor):
    """The bytes of a contiguous tensor, as a buffer zmq sends without a copy."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def typed(frame, like: torch.Tensor, what: str) -> torch.Tensor:
    """A received payload viewed as a flat tensor like ``like`` (no copy).

    Raises:
        GroupError: the payload is not the size of ``like``.
    """
    expected = like.numel() * like.element_size()
    if len(frame) != expected:
        raise GroupError(f"{what}: {len(frame)} bytes, expected {expected} (the workers "
                         "called collectives of different sizes)")  # fmt: skip
    if not expected:
        return like[:0]
    return torch.frombuffer(frame.buffer, dtype=torch.uint8).view(like.dtype)


def _reduced(parts: list[torch.Tensor], reduce: Reduce) -> torch.Tensor:
    """The reduction of ``parts`` in rank order, in a new tensor."""
    total = parts[0].clone()
    for part in parts[1:]:
        reduce(total, part)
    return total
