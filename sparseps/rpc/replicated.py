"""``ShardRequest``: one shard's part of a client call when shards have copies.

Without replicas a shard's request is one call to its server. With ``--replicas R``
(:mod:`sparseps.core.replicas`) a request goes to the shard's live copies:

- *every copy* for what changes a shard (pushes, table creation, loads, decay, ...): an
  update's copies carry the same ``(client, seq)``, so each copy applies it once even
  when it is sent again; the request succeeds when every copy that is still alive
  answered, which is at least one;
- *one copy* for what reads it (pulls, saves): the first live server of the chain; when
  that server is lost while the call waits, the request moves to the next live copy.

A copy that fails for any other reason (a remote error, a timeout) fails the request as
it would without replicas. When no copy of a shard is left, the error names every server
of its chain and why each is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import UnavailableError
from .channel import Call, Channel
from .protocol import Reply

__all__ = ["ShardRequest"]


@dataclass(eq=False)
class ShardRequest:
    """The calls sent for one shard, and how to send a read to another copy.

    Attributes:
        shard: the shard.
        calls: the calls sent so far (one per copy).
        resend: for a one-copy request, sends it to a live copy not in the given ranks
            (None when there is none); None for every-copy requests.
        chain: the servers holding the shard, primary first (for the error message).
    """

    shard: int
    calls: list[Call]
    resend: Callable[[set[int]], Call | None] | None = None
    chain: tuple[int, ...] = ()

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
        first: Reply | None = None
        i = 0
        while i < len(self.calls):
            call = self.calls[i]
            i += 1
            try:
                reply = channel.wait(call, deadline, timeout)
            except UnavailableError:
                if channel.lost(call.rank) is None:
                    raise
                if self.resend is not None and first is None:
                    moved = self.resend({c.rank for c in self.calls})
                    if moved is not None:
                        self.calls.append(moved)
                continue
            if first is None:
                first = reply
        if first is None:
            raise self.no_copy_left(channel, self.calls[0].op)
        return first

    def no_copy_left(self, channel: Channel, op: str) -> UnavailableError:
        """The error of a shard whose every copy is lost."""
        chain = self.chain or tuple(call.rank for call in self.calls)
        reasons = "; ".join(
            f"server {rank} at {channel.endpoints[rank]}: {channel.lost(rank) or 'not tried'}"
            for rank in chain
        )
        return UnavailableError(
            f"{op}: no live copy of shard {self.shard} is left ({reasons}); the job lost "
            f"data: restart it from its last checkpoint (a job with --replicas R survives R "
            "lost servers per shard chain)",
            op=op, role="server", rank=chain[0], address=channel.endpoints[chain[0]],
        )  # fmt: skip
