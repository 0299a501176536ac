"""``ShardChain``: one copy of a replicated shard and its place in the shard's chain.

With ``--replicas R`` each shard has ``R + 1`` copies (:mod:`sparseps.core.replicas`).
Every copy keeps the shard's *view*: an epoch and the copies, head first (at the start:
epoch 0 and the chain ``s, s + 1, ..., s + R``). The copies apply every write in one
order, the head's:

- **Writes go to the head.** It applies a write, gives it the next *index* of the shard's
  order and passes it to the next copy of the view (:class:`~.chain_successor.Successor`),
  which applies it and passes it on in turn. A copy acknowledges a write once the copy
  after it did (the tail at once), so when the head answers, the write is on every live
  copy; and since every copy applies the writes in index order, live copies are
  bit-identical. A copy applies index ``i`` only after ``i - 1``; one it has (a write
  passed on again after a loss) is acknowledged without applying it again.
- **Reads** may go to any copy that is not recovering (clients send them to the head).
- **A lost copy.** A copy passes its unacknowledged writes again to the copy after a lost
  one (:mod:`.chain_successor`); the head also drops lost copies from its view (a new
  epoch). When the head is lost, the first live copy after it takes the shard over on the
  first request that reaches it: it holds every write any later copy holds (writes flow
  down the chain), so nothing acknowledged is missing. A copy counts a peer as lost only
  when its own connection to it dropped (:class:`~sparseps.rpc.channel.Channel` with loss
  detection); until then a request for a head it still reaches is refused
  (:class:`~sparseps.core.replicas.NotHeadError`) and the client asks again.
- **A replacement joins at the end.** A lost server's replacement (:mod:`.recovery`) asks
  the head to ``replicate``: the head pauses writes (refused with
  :class:`~sparseps.core.replicas.ShardBusyError`, sent again by the client), waits until
  every write it passed on is acknowledged, saves the shard's tables into a folder both
  servers see, and answers the files, the ``(client, seq)`` updates applied (a client's
  late retry of an old write is not applied twice) and its index. The replacement loads
  them; ``replicate_done`` puts it at the end of the view (a new epoch) and resumes
  writes, which from then on reach it down the chain.

Every client write carries the client's epoch of the shard; the head refuses an older one
(:class:`~sparseps.core.replicas.StaleEpochError`) so that clients learn each view (and
the copies to fail over to). A copy refuses a write passed on from an older epoch than its
own: it comes from a head that was replaced.

Not handled: a copy that loses its connection to a head that is still alive (a network
partition between hosts) takes over as a second head; on one host a dropped connection
means the process is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..core.replicas import (
    ChainGapError,
    NotHeadError,
    RecoveringError,
    ShardBusyError,
    StaleEpochError,
    chain,
)
from ..errors import InputError, SparsePSError
from ..rpc.channel import Channel
from ..rpc.ops import SHARD_WRITE_OPS
from ..rpc.protocol import Request
from .chain_successor import Entry, Successor
from .relay import Relay, Route

__all__ = ["PAUSE_LIMIT_S", "ShardChain"]

log = logging.getLogger(__name__)

# Longest a head stays paused for a replacement that does not finish its copy.
PAUSE_LIMIT_S = 120.0
# Writes passed on before a pause get this long to be acknowledged.
_DRAIN_S = 30.0
# Ops every copy answers, recovering or not (the replication protocol's own, and liveness).
ALWAYS_ADMITTED = frozenset({"shard_info", "replicate", "replicate_done", "ping", "stop", "stats"})

# run_once(request) -> (result, bufs, applied now): False for an update applied before
RunOnce = Callable[[Request], tuple[object, list, bool]]


class ShardChain:
    """One copy's view of its shard and the order of the shard's writes.

    Args:
        shard: the shard.
        holder: the rank of the server process holding this copy.
        num_servers: servers in the job.
        replicas: backup copies per shard.
        recovering: a replacement's copy: it refuses clients until it has joined.
    """

    def __init__(
        self, shard: int, holder: int, num_servers: int, replicas: int, *, recovering: bool
    ) -> None:
        self.shard = shard
        self.holder = holder
        self.num_servers = num_servers
        self.replicas = replicas
        self.epoch = 0
        self.members = chain(shard, num_servers, replicas)
        self.recovering = recovering
        self.index = 0  # the last write applied, in the shard's order
        # held while a write is applied and passed on: one order for every copy
        self.order = threading.RLock()
        self._paused_until: float | None = None
        self.peers: Channel | None = None
        self.successor: Successor | None = None

    def attach(self, peers: Channel, relay: Relay | None) -> None:
        """Connect this copy to the other servers (the server process's channel)."""
        self.peers = peers
        self.successor = Successor(
            self.shard, self.holder, peers, relay, next_copy=self._next_copy, order=self.order
        )

    def stop(self) -> None:
        if self.successor is not None:
            self.successor.stop()

    # -- requests ----------------------------------------------------------------------

    def handle(self, request: Request, route: Route | None, run_once: RunOnce):
        """Run ``request`` on this copy: ``(result, bufs)``, or None when the answer
        leaves later (once the next copy acknowledged the write) through the relay."""
        op = request.op
        if op in ALWAYS_ADMITTED:
            return run_once(request)[:2]
        if self.recovering:
            raise RecoveringError(
                f"server {self.holder}: its copy of shard {self.shard} is still being copied "
                "from a surviving copy; use another copy"
            )
        if request.forward is not None:
            return self._passed_on(request, route, run_once)
        if op not in SHARD_WRITE_OPS:
            return run_once(request)[:2]
        with self.order:
            self._take_writes(request)
            result, bufs, applied = run_once(request)
            if not applied:  # a write sent again: answered once the first one is
                return self._after_earlier((result, bufs), route)
            self.index += 1
            return self._pass_on(request, self.index, (result, bufs), route)

    def _passed_on(self, request: Request, route: Route | None, run_once: RunOnce):
        """A write the copy before this one passed on (one thread applies them in order)."""
        forward = request.forward
        assert forward is not None
        with self.order:
            if request.epoch is not None and request.epoch < self.epoch:
                raise StaleEpochError(
                    f"shard {self.shard} is at epoch {self.epoch} on server {self.holder}, the "
                    f"write passed on is from epoch {request.epoch} (a replaced head)"
                )
            if forward.index <= self.index:  # passed on again: this copy has it
                return self._after_earlier(({"duplicate": True}, []), route)
            if forward.index != self.index + 1:
                raise ChainGapError(
                    f"shard {self.shard}: server {self.holder} applied writes up to "
                    f"{self.index}, got write {forward.index}; pass on from {self.index + 1}"
                )
            self._adopt(request.epoch, forward.members)
            try:
                result, bufs, _ = run_once(request)
            finally:
                self.index = forward.index  # a failed write keeps its place in the order
            return self._pass_on(request, forward.index, (result, bufs), route)

    def _pass_on(self, request: Request, index: int, answer: tuple[object, list], route):
        if self.successor is None:  # in-process (tests): no other copy to reach
            return answer
        entry = Entry(
            request.op, request.table, tuple(request.bufs.values()), dict(request.args),
            request.client, request.seq, index,
        )  # fmt: skip
        return self.successor.pass_on(entry, answer, route)

    def _after_earlier(self, answer: tuple[object, list], route: Route | None):
        if self.successor is None:
            return answer
        return self.successor.after_earlier(answer, route)

    # -- the view ----------------------------------------------------------------------

    def _lost(self, rank: int) -> bool:
        return rank != self.holder and self.peers is not None and self.peers.lost(rank) is not None

    def _take_writes(self, request: Request | None) -> None:
        """Check that this copy takes the shard's writes now (order lock held): it is the
        head, or takes the shard over from a lost one; not paused; not older than the
        sender's view.

        Raises:
            NotHeadError: another copy is the head (the client refreshes its view).
            StaleEpochError: the sender's view is older than this copy's.
            ShardBusyError: paused for a replacement server.
        """
        members = self.members
        if self.holder not in members:
            raise NotHeadError(
                f"server {self.holder} is no longer among the copies of shard {self.shard} "
                f"(epoch {self.epoch}: servers {list(members)})"
            )
        before = members[: members.index(self.holder)]
        if before:
            alive = [m for m in before if not self._lost(m)]
            if alive:
                raise NotHeadError(
                    f"shard {self.shard}: server {alive[0]} is its head (epoch {self.epoch}, "
                    f"copies on servers {list(members)}); refresh with shard_info"
                )
            self._take_over(before)
        if request is not None and request.epoch is not None and request.epoch < self.epoch:
            raise StaleEpochError(
                f"shard {self.shard} is at epoch {self.epoch} (copies on servers "
                f"{list(self.members)}), the request at {request.epoch}; refresh with shard_info"
            )
        if self._paused():
            raise ShardBusyError(
                f"shard {self.shard} is paused while a replacement server copies it; send again"
            )

    def _take_over(self, lost: tuple[int, ...]) -> None:
        members = self.members
        self.members = tuple(m for m in members[members.index(self.holder) :] if not self._lost(m))
        self.epoch += 1
        log.warning(
            "server %d: head of shard %d from epoch %d (server(s) %s lost; %d writes applied); "
            "copies on servers %s", self.holder, self.shard, self.epoch,
            ", ".join(map(str, lost)), self.index, list(self.members),
        )  # fmt: skip

    def _next_copy(self) -> tuple[int, int, tuple[int, ...]] | None:
        """``(rank, epoch, members)`` of the next live copy after this one, or None (the
        tail). The head drops lost copies from its view first (order lock held)."""
        members = self.members
        if members and members[0] == self.holder and any(self._lost(m) for m in members[1:]):
            gone = [m for m in members if self._lost(m)]
            self.members = tuple(m for m in members if not self._lost(m))
            self.epoch += 1
            log.warning(
                "server %d, shard %d: server(s) %s lost; epoch %d, copies on servers %s",
                self.holder, self.shard, ", ".join(map(str, gone)), self.epoch,
                list(self.members),
            )  # fmt: skip
        members = self.members
        if self.holder not in members:
            return None
        for rank in members[members.index(self.holder) + 1 :]:
            if not self._lost(rank):
                return rank, self.epoch, members
        return None

    def _adopt(self, epoch: int | None, members: tuple[int, ...]) -> None:
        """Take the view a write passed on carries (a newer epoch: a copy joined, was
        dropped, or another copy is the head)."""
        if epoch is None or (epoch == self.epoch and members == self.members):
            return
        newer = epoch > self.epoch
        self.epoch, self.members = max(epoch, self.epoch), members
        if newer and self.peers is not None:
            for rank in members:  # a replacement on a lost server's port: connect again
                if rank != self.holder and self.peers.lost(rank) is not None:
                    self.peers.revive(rank)

    def _paused(self) -> bool:
        if self._paused_until is None:
            return False
        if time.monotonic() < self._paused_until:
            return True
        log.warning(
            "server %d, shard %d: the replacement did not finish its copy within %.0f s; "
            "writes resume on epoch %d", self.holder, self.shard, PAUSE_LIMIT_S, self.epoch,
        )  # fmt: skip
        self._paused_until = None
        return False

    # -- the replication ops -----------------------------------------------------------

    def info(self) -> dict:
        """``shard_info``: this copy's view."""
        return {
            "shard": self.shard,
            "epoch": self.epoch,
            "members": list(self.members),
            "recovering": self.recovering,
            "index": self.index,
        }

    def replicate(self, joiner: int, save: Callable[[], tuple[dict, dict]], applied: list) -> dict:
        """``replicate`` (at the head): pause writes, wait until every write passed on is
        acknowledged, and save the shard for server ``joiner``."""
        copies = chain(self.shard, self.num_servers, self.replicas)
        if joiner not in copies:
            raise InputError(
                f"replicate: server {joiner} holds no copy of shard {self.shard} "
                f"(its copies: {list(copies)})"
            )
        with self.order:
            self._take_writes(None)
            self._paused_until = time.monotonic() + PAUSE_LIMIT_S
        if self.successor is not None and not self.successor.drained(_DRAIN_S):
            with self.order:
                self._paused_until = None
            raise ShardBusyError(
                f"shard {self.shard}: writes passed on were not acknowledged within {_DRAIN_S} s"
            )
        try:
            started = time.perf_counter()
            tables, dense = save()
        except SparsePSError:
            with self.order:
                self._paused_until = None
            raise
        log.info(
            "server %d, shard %d: paused and saved %d table(s) and %d dense table(s) in %.2f s "
            "for server %d", self.holder, self.shard, len(tables), len(dense),
            time.perf_counter() - started, joiner,
        )  # fmt: skip
        return {
            "tables": tables,
            "dense": dense,
            "applied": applied,
            "epoch": self.epoch + 1,
            "index": self.index,
        }

    def replicate_done(self, joiner: int, epoch: int) -> dict:
        """``replicate_done`` (at the head): server ``joiner`` holds the copy saved by
        ``replicate``: it joins the end of the view, and writes resume."""
        with self.order:
            self.epoch = max(self.epoch + 1, epoch)
            self.members = (*(m for m in self.members if m != joiner), joiner)
            self._paused_until = None
            if self.peers is not None and self.peers.lost(joiner) is not None:
                self.peers.revive(joiner)  # the lost server's port: its replacement now
        log.info(
            "server %d, shard %d: server %d joined; epoch %d, copies on servers %s",
            self.holder, self.shard, joiner, self.epoch, list(self.members),
        )  # fmt: skip
        return {"epoch": self.epoch, "members": list(self.members)}

    def join(self, index: int, answer: dict) -> None:
        """Take the view of a ``replicate_done`` answer and the index the saved copy
        was at, and start serving (this copy holds the shard now)."""
        with self.order:
            self.index = index
            self.epoch = int(answer["epoch"])
            self.members = tuple(int(m) for m in answer["members"])
            self.recovering = False
