"""``ShardRequest``: one shard's part of a client call when shards have copies.

Without replicas a shard's request is one call to its server. With ``--replicas R``
(:mod:`sparseps.core.replicas`) a request goes to the shard's live copies:

- *every copy* for what changes a shard (pushes, table creation, loads, decay, ...): an
  update's copies carry the same ``(client, seq)``, so each copy applies it once even
  when it is sent again; the request succeeds when every copy that is still alive
  answered, which is at least one;
- *one copy* for what reads it (pulls, saves): the first live server of the chain; when
  that server is lost while the call waits, the request moves to the next live copy.

While a replacement server joins (:mod:`sparseps.server.replica_ops`) a copy may answer
that it is paused (the write is sent again a moment later), that the shard moved to a
later epoch (the client refreshes its view of the copies, reconnects to the new one and
sends the write to every copy, same ``seq``), or that it is still recovering (it counts
as lost until a refresh brings it back).

A copy that fails for any other reason (a remote error, a timeout) fails the request as
it would without replicas. When no copy of a shard is left, the error names every server
of its chain and why each is lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from ..errors import DeadlineError, RemoteError, UnavailableError
from .channel import Call, Channel
from .protocol import Reply

__all__ = ["BUSY_RETRY_S", "ShardRequest", "ShardRouter"]

# How long a write refused by a paused copy waits before it is sent again.
BUSY_RETRY_S = 0.02


class ShardRouter(Protocol):
    """What a :class:`ShardRequest` needs from its client."""

    def live_copies(self, shard: int) -> list[int]: ...

    def resend(self, request: ShardRequest, rank: int) -> Call: ...

    def refresh(self, shard: int, rank: int) -> None: ...


@dataclass(eq=False)
class ShardRequest:
    """The calls sent for one shard.

    Attributes:
        shard: the shard.
        op: the op.
        calls: the calls sent so far.
        every: sent to every live copy (a write) rather than to the first (a read).
        router: sends it again (same ``seq``), and refreshes the client's view.
        chain: the servers holding the shard, primary first (for the error message).
        seq: the update's sequence number shared by its copies (None: not an update).
        bufs, args, table: what is sent.
    """

    shard: int
    op: str
    calls: list[Call]
    every: bool
    router: ShardRouter | None = None
    chain: tuple[int, ...] = ()
    seq: int | None = None
    bufs: tuple = ()
    args: dict | None = None
    table: str | None = None

    def done(self) -> bool:
        return all(call.event.is_set() for call in self.calls)

    def forget(self, channel: Channel) -> None:
        for call in self.calls:
            channel.forget(call)

    def wait(self, channel: Channel, deadline: float, timeout: float) -> Reply:
        """The first answering copy's reply (in chain order).

        Raises:
            UnavailableError: every copy of the shard is lost.
            DeadlineError, RemoteError, ProtocolError: as for a single call.
        """
        pending = list(self.calls)
        answered: dict[int, Reply] = {}
        while pending:
            call = pending.pop(0)
            try:
                answered[call.rank] = channel.wait(call, deadline, timeout)
                continue
            except UnavailableError:
                if channel.lost(call.rank) is None:
                    raise
            except RemoteError as exc:
                moved = self._moved(channel, call, exc, deadline)
                if moved is None:
                    raise
                pending += moved
                continue
            if not self.every and not answered:  # a read: on to the next live copy
                pending += self._to_untried(pending)
        for rank in self.chain or [c.rank for c in self.calls]:
            if rank in answered:
                return answered[rank]
        raise self.no_copy_left(channel)

    def _moved(
        self, channel: Channel, call: Call, exc: RemoteError, deadline: float
    ) -> list[Call] | None:
        """The calls to make after a replication refusal (None: a real failure)."""
        router = self.router
        if router is None:
            return None
        kind = exc.remote_type
        if kind == "ShardBusyError":
            if time.monotonic() + BUSY_RETRY_S > deadline:
                raise DeadlineError(
                    f"{self.op}: shard {self.shard} stayed paused for a replacement server "
                    "until the deadline", op=self.op, role="server", rank=call.rank,
                    address=channel.endpoints[call.rank], seconds=0.0,
                    setting="PSClient(timeout=...)",
                )  # fmt: skip
            time.sleep(BUSY_RETRY_S)
            return [router.resend(self, call.rank)]
        if kind == "StaleEpochError":
            router.refresh(self.shard, call.rank)
            tried = {c.rank for c in self.calls}
            again = [router.resend(self, call.rank)]
            again += [
                router.resend(self, r) for r in router.live_copies(self.shard) if r not in tried
            ]
            return again
        if kind == "RecoveringError":
            channel.mark_lost(call.rank, f"it is a replacement still copying shard {self.shard}")
            return [] if self.every else self._to_untried([])
        return None

    def _to_untried(self, pending: list[Call]) -> list[Call]:
        if self.router is None:
            return []
        tried = {c.rank for c in self.calls} | {c.rank for c in pending}
        for rank in self.router.live_copies(self.shard):
            if rank not in tried:
                return [self.router.resend(self, rank)]
        return []

    def no_copy_left(self, channel: Channel) -> UnavailableError:
        """The error of a shard whose every copy is lost."""
        chain = self.chain or tuple(call.rank for call in self.calls)
        reasons = "; ".join(
            f"server {rank} at {channel.endpoints[rank]}: {channel.lost(rank) or 'not tried'}"
            for rank in chain
        )
        return UnavailableError(
            f"{self.op}: no live copy of shard {self.shard} is left ({reasons}); the job lost "
            f"data: restart it from its last checkpoint (a job with --replicas R survives R "
            "lost servers per shard chain)",
            op=self.op, role="server", rank=chain[0], address=channel.endpoints[chain[0]],
        )  # fmt: skip
