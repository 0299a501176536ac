"""``ShardViews``: what a client of a replicated job knows of each shard's copies.

A shard's *view* is its epoch and its copies, head first, as a copy's ``shard_info`` last
said (at the start: epoch 0 and the shard's chain, :func:`sparseps.core.replicas.chain`).
Requests go to the view's first copy this client does not count as lost
(:class:`~sparseps.rpc.replicated.ShardRequest` follows refusals and losses), except
reads (:data:`SPREAD_OPS`): those take the view's live copies in turn, so a shard whose
rows are hot (power-law ids send most pulls to a few shards) is read from every copy, not
only from its head's server. Any copy may answer a read: live copies are bit-identical,
and the head acknowledges a write only once every live copy applied it, so a read sent
after a write's answer sees it on whichever copy answers (reads in flight with a write
may see it or not, as with the head). A copy that is lost or refuses (recovering) sends
the read back to the head, as any request (:mod:`sparseps.rpc.replicated`).

:meth:`ShardViews.refresh` asks the copies for their view and keeps the newest. It asks
the chain's servers this client reaches first; copies the newest view names that the
client had counted as lost (a replacement on a lost server's port) are probed: the
client connects again and asks ``shard_info``, and a server that does not answer (the
port refuses the connection, or :data:`PROBE_S` pass) is lost again. When no reachable
server answers, every server of the chain is probed that way: this is how a client that
only reads finds a replacement it never heard of.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence

from ..core.replicas import chain
from ..errors import SparsePSError
from .call import Call
from .channel import Channel
from .ops import SHARD_WRITE_OPS
from .replicated import ShardRequest

__all__ = ["PROBE_S", "SPREAD_OPS", "ShardViews"]

# Reads spread over a shard's live copies (writes, saves and table-wide ops: its head).
SPREAD_OPS = frozenset({"pull", "pull_dense"})

# Longest wait for a copy's shard_info while probing (a refused connection ends it sooner).
PROBE_S = 3.0
_POLL_S = 0.01


class ShardViews:
    """Per shard: the epoch and the copies (head first) this client last learned.

    Args:
        channel: the client's channel (loss detection on).
        num_servers: servers in the job.
        replicas: backup copies per shard.
        spread_reads: send :data:`SPREAD_OPS` to the shard's live copies in turn (False:
            every request to the head, as before issue 59; benches compare the two).
    """

    def __init__(
        self, channel: Channel, num_servers: int, replicas: int, *, spread_reads: bool = True
    ) -> None:
        self.channel = channel
        self.num_servers = num_servers
        self.replicas = replicas
        self.spread_reads = spread_reads
        self._views = [(0, chain(s, num_servers, replicas)) for s in range(num_servers)]
        self._lock = threading.Lock()
        # per shard: the reads sent, which picks the copy of the next one
        self._turns = [itertools.count() for _ in range(num_servers)]

    def chain(self, shard: int) -> tuple[int, ...]:
        return chain(shard, self.num_servers, self.replicas)

    def members(self, shard: int) -> tuple[int, ...]:
        """The copies of ``shard`` in this client's view, head first."""
        return self._views[shard][1]

    def head(self, shard: int) -> int | None:
        """The first copy of the view this client does not count as lost (None: none)."""
        for rank in self._views[shard][1]:
            if self.channel.lost(rank) is None:
                return rank
        return None

    def reader(self, shard: int) -> int | None:
        """The copy the next read of ``shard`` goes to: the view's live copies in turn
        (None: none is live)."""
        live = [rank for rank in self._views[shard][1] if self.channel.lost(rank) is None]
        if not live:
            return None
        return live[next(self._turns[shard]) % len(live)]

    def request(
        self, shard: int, op: str, table: str | None, bufs: Sequence, args: dict | None,
        seq: int | None,
    ) -> ShardRequest:  # fmt: skip
        """Send one shard's request to its head, or a read to one of its live copies
        (refreshing the view first when none of its copies is reachable)."""
        request = ShardRequest(
            shard, op, [], router=self, chain=self.chain(shard), seq=seq, bufs=tuple(bufs),
            args=args, table=table,
        )  # fmt: skip
        spread = self.spread_reads and op in SPREAD_OPS
        rank = self.reader(shard) if spread else self.head(shard)
        if rank is None:
            self.refresh(shard, time.monotonic() + self.channel.timeout)
            rank = self.head(shard)
        if rank is None:
            raise request.no_copy_left(self.channel)
        self.resend(request, rank)
        return request

    # -- ShardRouter (sparseps.rpc.replicated) ------------------------------------------

    def resend(self, request: ShardRequest, rank: int) -> Call:
        """Send ``request`` to server ``rank`` (its seq; this client's epoch of the shard
        when it is a write)."""
        shard = request.shard
        call = self.channel.submit(
            rank, request.op, request.table, request.bufs, request.args,
            shard=None if rank == shard else shard, seq=request.seq,
            epoch=self._views[shard][0] if request.op in SHARD_WRITE_OPS else None,
        )  # fmt: skip
        request.calls.append(call)
        return call

    def refresh(self, shard: int, deadline: float) -> None:
        """Learn the newest view of ``shard`` from its copies (see the module docstring)."""
        ranks = self.chain(shard)
        reachable = [r for r in ranks if self.channel.lost(r) is None]
        answers = self._ask(shard, reachable, deadline, probe=False)
        if not answers:  # nobody reachable answered: look for copies on lost servers' ports
            answers = self._ask(
                shard, [r for r in ranks if r not in reachable], deadline, probe=True
            )
        if not answers:
            return
        epoch, members = max(answers)
        with self._lock:
            if epoch >= self._views[shard][0]:
                self._views[shard] = (epoch, members)
        unseen = [r for r in members if self.channel.lost(r) is not None]
        if unseen:  # copies that joined on ports this client had counted as lost
            self._ask(shard, unseen, deadline, probe=True)

    def _ask(
        self, shard: int, ranks: Sequence[int], deadline: float, *, probe: bool
    ) -> list[tuple[int, tuple[int, ...]]]:
        """``(epoch, members)`` of each of ``ranks`` that answers ``shard_info`` and is not
        recovering. ``probe``: connect to them again first, and count the ones that do
        not answer within :data:`PROBE_S` (or refuse the connection) as lost again."""
        if probe:
            for rank in ranks:
                self.channel.revive(rank)
        calls = []
        for rank in ranks:
            try:
                calls.append(self.channel.submit(
                    rank, "shard_info", None, shard=None if rank == shard else shard
                ))  # fmt: skip
            except SparsePSError:
                continue
        limit = min(deadline, time.monotonic() + PROBE_S) if probe else deadline
        answers = []
        for call in calls:
            info = self._answer(call, limit, probe)
            if info is not None and not info["recovering"]:
                answers.append((int(info["epoch"]), tuple(int(m) for m in info["members"])))
        return answers

    def _answer(self, call: Call, limit: float, probe: bool) -> dict | None:
        channel = self.channel
        while True:
            left = limit - time.monotonic()
            if channel.settled(call, max(0.0, min(left, _POLL_S))):
                break
            refused = probe and channel.refusing(call.rank)
            if left <= 0 or refused:
                channel.forget(call)
                if probe:
                    channel.mark_lost(
                        call.rank, "it did not answer shard_info after reconnecting"
                        + (" (the connection is refused)" if refused else f" within {PROBE_S:g} s"),
                    )  # fmt: skip
                return None
        try:
            result = channel.wait(call, limit, PROBE_S).result
        except SparsePSError:
            return None
        return result if isinstance(result, dict) else None
