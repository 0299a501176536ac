"""``Call``: one request to one server, waiting for its reply; ``PendingCalls``: the
channel's book of them.

Every part of a :class:`~sparseps.rpc.channel.Channel` meets the calls that wait: the
channel writes a call into the book when it sends it, the waiting readers
(:mod:`.channel_receive`) take it out when its reply comes, the connections
(:mod:`.channel_links`) take out every call of a server that is lost or refuses us. The
book also bounds how many calls may wait at once (``max_in_flight``): a call holds one
in-flight slot from its send until it leaves the book, however it leaves.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .protocol import Forward, Reply

if TYPE_CHECKING:
    from .reply_slots import ReplySlots

__all__ = ["Call", "PendingCalls"]


@dataclass(eq=False)
class Call:
    """One request to one server, waiting for its reply."""

    id: int
    rank: int
    op: str
    table: str | None
    event: threading.Event = field(default_factory=threading.Event)
    reply: Reply | None = None
    failure: BaseException | None = None
    # An update keeps what it sent, to send it again (same seq) after a timeout.
    seq: int | None = None
    resend: tuple | None = None
    retries_left: int = 0
    shard: int | None = None  # a replica's shard (None: the server's own)
    epoch: int | None = None  # the sender's epoch of the shard (replicated writes)
    # a write one copy of a replicated shard passes on to the next: the writer's client
    # id (the update's (client, seq) travels along the chain) and its place in the order
    client: int | None = None
    forward: Forward | None = None
    # (segment's mapping, index): the reply slot offered for its answer (reply_slots)
    slot: tuple[ReplySlots, int] | None = None


class PendingCalls:
    """The calls that wait for a reply, by request id, at most ``max_in_flight`` of them.

    A sender :meth:`reserve`\\ s an in-flight slot before it sends, then :meth:`add`\\ s
    the call; whoever takes the call out (:meth:`take`, :meth:`take_rank`,
    :meth:`take_all`) frees its slot, so a slot is freed exactly once.
    """

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._calls: dict[int, Call] = {}
        self._free = threading.BoundedSemaphore(max_in_flight)

    def reserve(self, timeout: float | None = None) -> bool:
        """An in-flight slot: at once (``timeout`` None), or within ``timeout`` seconds."""
        if timeout is None:
            return self._free.acquire(blocking=False)
        return self._free.acquire(timeout=timeout)

    def unreserve(self) -> None:
        """Give back a reserved slot whose call was never added (its request did not encode)."""
        self._free.release()

    def add(self, call: Call) -> None:
        with self._lock:
            self._calls[call.id] = call

    def __contains__(self, call_id: object) -> bool:
        with self._lock:
            return call_id in self._calls

    def take(self, call_id: int | None) -> Call | None:
        """The call of ``call_id``, out of the book (None: answered, failed or given up)."""
        if call_id is None:
            return None
        with self._lock:
            call = self._calls.pop(call_id, None)
        if call is not None:
            self._free.release()
        return call

    def take_rank(self, rank: int) -> list[Call]:
        """Every call waiting for server ``rank``, out of the book."""
        with self._lock:
            calls = [c for c in self._calls.values() if c.rank == rank]
            for call in calls:
                del self._calls[call.id]
        for _ in calls:
            self._free.release()
        return calls

    def take_all(self) -> list[Call]:
        """Every call, out of the book (the channel is closing)."""
        with self._lock:
            calls, self._calls = list(self._calls.values()), {}
        for _ in calls:
            self._free.release()
        return calls
