"""``Call``: one request to one server, waiting for its reply (the channel's record of it)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .protocol import Forward, Reply

if TYPE_CHECKING:
    from .reply_slots import ReplySlots

__all__ = ["Call"]


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
