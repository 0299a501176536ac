"""``ShardRequest``: one shard's part of a client call when shards have copies.

Without replicas a shard's request is one call to its server. With ``--replicas R``
(:mod:`sparseps.core.replicas`) each shard has a chain of copies whose first live one,
the *head*, takes every request of the shard: it orders the writes and passes each down
the chain, and answers a write once every live copy has it
(:mod:`sparseps.server.shard_chain`). The client keeps a *view* of each shard (its epoch
and its copies, head first, as ``shard_info`` last said) and sends to the view's head.

What a copy may answer instead, and what the request does then:

- the head is lost (its connection dropped): the next copy of the view is asked; a copy
  whose every predecessor is lost takes the shard over and serves it;
- ``ShardBusyError`` (the head is paused while a replacement server copies the shard):
  sent again a moment later;
- ``NotHeadError``, ``StaleEpochError``, ``RecoveringError`` (the shard's copies changed:
  another copy took over, a replacement joined, or this one is still being copied): the
  view is refreshed from the copies (:meth:`ShardRouter.refresh`, which also reconnects to
  copies this client had counted as lost, such as a replacement on a lost server's port)
  and the request is sent to the head it names.

An update keeps its ``(client, seq)`` through all of this, so a copy applies it once
however often it is sent. A copy that fails for any other reason (a remote error) fails
the request as it would without replicas; when no copy of a shard answers, the error
names every server of its chain and why each is lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from ..errors import DeadlineError, RemoteError, UnavailableError
from .channel import Call, Channel
from .protocol import Reply

__all__ = ["BUSY_RETRY_S", "ShardRequest", "ShardRouter"]

# How long a request refused by a paused copy, or sent to a copy that does not yet see
# its head as lost, waits before it is sent again.
BUSY_RETRY_S = 0.02
# The refusals after which the client refreshes its view of the shard.
_VIEW_CHANGED = frozenset({"NotHeadError", "StaleEpochError", "RecoveringError"})


class ShardRouter(Protocol):
    """What a :class:`ShardRequest` needs from its client."""

    def head(self, shard: int) -> int | None: ...

    def resend(self, request: ShardRequest, rank: int) -> Call: ...

    def refresh(self, shard: int, deadline: float) -> None: ...


@dataclass(eq=False)
class ShardRequest:
    """The calls sent for one shard (the last one is the one waited for).

    Attributes:
        shard: the shard.
        op: the op.
        calls: the calls sent so far.
        router: sends it again (same ``seq``) and refreshes the client's view (None:
            a job without replicas).
        chain: the servers that may hold the shard (for the error message).
        seq: the update's sequence number, the same on every send (None: not an update).
        bufs, args, table: what is sent.
    """

    shard: int
    op: str
    calls: list[Call]
    router: ShardRouter | None = None
    chain: tuple[int, ...] = ()
    seq: int | None = None
    bufs: tuple = ()
    args: dict | None = None
    table: str | None = None

    def done(self) -> bool:
        return bool(self.calls) and self.calls[-1].event.is_set()

    def forget(self, channel: Channel) -> None:
        for call in self.calls:
            channel.forget(call)

    def wait(self, channel: Channel, deadline: float, timeout: float) -> Reply:
        """The reply of the shard's head, following the shard's copies as they change.

        Raises:
            UnavailableError: no copy of the shard is left.
            DeadlineError, RemoteError, ProtocolError: as for a single call.
        """
        while True:
            call = self.calls[-1]
            try:
                return channel.wait(call, deadline, timeout)
            except UnavailableError:
                if self.router is None or channel.lost(call.rank) is None:
                    raise
                self._send_to_head(channel, deadline)
            except RemoteError as exc:
                kind = exc.remote_type
                if self.router is None or not (kind == "ShardBusyError" or kind in _VIEW_CHANGED):
                    raise
                self._pause(channel, call, deadline, kind)
                if kind == "ShardBusyError":
                    self.router.resend(self, call.rank)
                else:
                    self.router.refresh(self.shard, deadline)
                    self._send_to_head(channel, deadline)

    def _send_to_head(self, channel: Channel, deadline: float) -> None:
        """Send again to the head of the client's view (refreshing the view when none of
        its copies is live)."""
        router = self.router
        assert router is not None
        rank = router.head(self.shard)
        if rank is None:
            router.refresh(self.shard, deadline)
            rank = router.head(self.shard)
        if rank is None:
            raise self.no_copy_left(channel)
        router.resend(self, rank)

    def _pause(self, channel: Channel, call: Call, deadline: float, kind: str) -> None:
        if time.monotonic() + BUSY_RETRY_S > deadline:
            raise DeadlineError(
                f"{self.op}: shard {self.shard} found no copy taking its requests before the "
                f"deadline (server {call.rank} last answered {kind})", op=self.op,
                role="server", rank=call.rank, address=channel.endpoints[call.rank],
                seconds=0.0, setting="PSClient(timeout=...)",
            )  # fmt: skip
        time.sleep(BUSY_RETRY_S)

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
