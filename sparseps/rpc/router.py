"""Which server gets each request: the ``Router`` contract and the plain router.

A :class:`~sparseps.rpc.client.PSClient` holds a :class:`~sparseps.rpc.channel.Channel`
(the wire) and a router. Every client starts with the :class:`PlainRouter`: a key goes to
``server_of(key, S)`` over the client's endpoint list (the servers' own rank order), a
shard's request to its server (with replicas: to the head of the shard's copies,
:class:`~sparseps.rpc.shard_views.ShardViews`), a table-wide op to every shard.

A job whose servers hold a placement (an elastic job: docs/elastic.md) is routed by a
placement router instead (:class:`PlacementRouting`; sparseps.elastic's
``PlacementRouter``): keys by the placement's owners, table-wide ops to its live servers,
refused parts sent again while shards move. A client holds one from the start when it
follows placements (``follow_placement``, the default) and switches to it once it finds
that the servers hold a placement: a table-wide call asks them first, and a keyed call a
server refused for a placement reason hands the refused part over
(:mod:`sparseps.rpc.keyed`). Until then nothing of it runs.

The placement router is sparseps.elastic's, which sits above this package
(:mod:`sparseps.layers`): the client takes it by injection
(``PSClient(placement_routing=...)``), and a client made without one gets
sparseps.elastic's from :mod:`sparseps.rpc.following`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from ..core.routing import group_by_server, route_by_server
from .handle import Handle
from .keyed import KeyedBatch, KeyedHandle, TakeOver, owner_parts
from .ops import UPDATE_OPS
from .replicated import ShardRequest

if TYPE_CHECKING:
    from ..core.placement import Placement
    from .call import Call
    from .channel import Channel
    from .protocol import Reply
    from .shard_views import ShardViews

__all__ = [
    "Grouping",
    "PlacementRouting",
    "PlacementRoutingFactory",
    "PlainRouter",
    "Router",
    "result_of",
]


def result_of(reply: Reply) -> object:
    """What most ops answer: the reply's result (a table-wide op's default ``pick``)."""
    return reply.result


class Grouping(NamedTuple):
    """The keys of one call grouped by owner.

    Attributes:
        keys: the keys in owner order (deduplicated, or every occurrence).
        offsets: owner ``o``'s keys are ``keys[offsets[o]:offsets[o + 1]]``.
        inverse: ``keys[inverse]`` is the caller's key array (None: ``keys`` is it).
        route: what the router grouped by (a placement and its channel ranks; None for
            the plain router): its ``send`` sends by the same, whatever changed since.
    """

    keys: np.ndarray
    offsets: np.ndarray
    inverse: np.ndarray | None
    route: object = None


class Router(Protocol):
    """Where a client's requests go."""

    @property
    def placement(self) -> Placement | None:
        """The placement it routes by (None: the plain router)."""
        ...

    def group(self, keys: np.ndarray, *, dedup: bool) -> Grouping:
        """``keys`` grouped by owner, each distinct key once (``dedup``) or as given."""
        ...

    def send(self, batch: KeyedBatch, grouping: Grouping,
             finish: Callable[[list], object]) -> Handle:  # fmt: skip
        """One request per owner of ``grouping``; ``finish`` gets ``[(positions, reply)]``."""
        ...

    def table_wide(self, op: str, table: str | None, args: dict | None, *,
                   timeout: float | None, pick: Callable[[Reply], object]) -> list:  # fmt: skip
        """A table-wide op on every server of the job; ``pick(reply)`` of each."""
        ...

    def server_ranks(self) -> list[int]:
        """The channel ranks a per-server call (stats, ping, stop) goes to."""
        ...

    def shard_holders(self) -> list[tuple[int, tuple[int, ...]]]:
        """Each shard and the channel ranks that may hold it, first choice first."""
        ...


class PlacementRouting(Router, Protocol):
    """A router by the servers' placement (sparseps.elastic's ``PlacementRouter``)."""

    refreshes: int  # placements asked of the servers
    move_waits: int  # table-wide ops sent again after a refusal during a move

    def refresh(self) -> Placement | None:
        """Ask the servers for their placement and adopt the newest (None: they hold none)."""
        ...

    def take_over(self, batch: KeyedBatch, refused: np.ndarray,
                  limit: float) -> list:  # fmt: skip
        """Send ``batch.keys[refused]`` (refused by their servers) by the placement's
        owners and wait; ``[(positions, reply)]``."""
        ...


class PlacementRoutingFactory(Protocol):
    """Makes a client's placement router (the class itself, sparseps.elastic's)."""

    def __call__(
        self, channel: Channel, *, num_servers: int, retry_s: float
    ) -> PlacementRouting: ...


class PlainRouter:
    """Routing by ``server_of`` over the client's endpoint list (module docstring).

    Args:
        channel: the client's channel.
        views: the client's view of each shard's copies (replicas).
        replicas: backup copies per shard (0: a shard is its server).
        take_over: what a keyed call does with a part refused for a placement reason
            (the client's switch to its placement router; None: the refusal fails it).
    """

    placement: Placement | None = None

    def __init__(self, channel: Channel, views: ShardViews, *, replicas: int,
                 take_over: TakeOver | None) -> None:  # fmt: skip
        self.channel = channel
        self._views = views
        self.num_servers = len(channel.endpoints)
        self.replicas = replicas
        self._take_over = take_over

    def request(self, shard: int, op: str, table: str | None, bufs: Sequence[np.ndarray] = (),
                args: dict | None = None) -> Call | ShardRequest:  # fmt: skip
        """Send one shard's request: to its server, or with replicas to the head of the
        shard's copies (:mod:`sparseps.rpc.replicated`)."""
        if not self.replicas:
            return self.channel.submit(shard, op, table, bufs, args)
        # an update's every send carries one sequence number: each copy applies it once
        seq = self.channel.next_seq() if op in UPDATE_OPS else None
        return self._views.request(shard, op, table, bufs, args, seq)

    def each_shard(self, op: str, table: str | None, args: dict | None, *,
                   timeout: float | None, pick: Callable[[Reply], object],
                   shards: Sequence[int] | None = None) -> list:  # fmt: skip
        """One request per shard (or per shard of ``shards``); ``pick`` of each answer, in
        shard order."""
        shards = range(self.num_servers) if shards is None else shards
        requests = [self.request(shard, op, table, (), args) for shard in shards]
        return Handle(self.channel, requests, lambda replies: [pick(r) for r in replies]).wait(
            timeout
        )

    # -- Router ------------------------------------------------------------------------

    def group(self, keys: np.ndarray, *, dedup: bool) -> Grouping:
        if dedup:
            return Grouping(*group_by_server(keys, self.num_servers))
        return Grouping(*route_by_server(keys, self.num_servers))

    def send(self, batch: KeyedBatch, grouping: Grouping,
             finish: Callable[[list], object]) -> KeyedHandle:  # fmt: skip
        keys, columns = batch.keys, batch.columns
        parts = [
            (part, self.request(owner, batch.op, batch.table,
                                [keys[part], *(c[part] for c in columns)]))
            for owner, part in owner_parts(grouping.offsets, 0)
        ]  # fmt: skip
        return KeyedHandle(self.channel, batch, parts, finish, take_over=self._take_over)

    def table_wide(self, op: str, table: str | None, args: dict | None, *,
                   timeout: float | None, pick: Callable[[Reply], object]) -> list:  # fmt: skip
        return self.each_shard(op, table, args, timeout=timeout, pick=pick)

    def server_ranks(self) -> list[int]:
        """Every server this client does not count as lost."""
        return [r for r in range(self.num_servers) if self.channel.lost(r) is None]

    def shard_holders(self) -> list[tuple[int, tuple[int, ...]]]:
        """Each shard's copies in this client's view, head first."""
        return [(shard, self._views.members(shard)) for shard in range(self.num_servers)]
