"""The client side of an elastic job: routing by the servers' placement (issue 23).

A job turns elastic when its servers get a placement (:mod:`sparseps.core.placement`,
installed by ``sparseps scale`` or :func:`sparseps.elastic.install_placement`). Until
then a client routes with its plain router (:class:`sparseps.rpc.router.PlainRouter`:
``server_of(key, S)`` over its endpoint list), the code path of every job that never
scales. A server holding a placement refuses keys of virtual shards it does not own (or
is handing over) with ``PlacementError``, applying nothing. A client that follows
placements (the default) holds a :class:`PlacementRouter` and switches to it once it finds
the servers hold one; the router then:

1. fetches the placement from the servers it knows (``get_placement``, the highest
   version wins), connecting to the endpoints of new servers it names;
2. resends only the refused part of a keyed call, grouped by the new owners, after a
   short back-off (2 ms doubling to 50 ms), until ``placement_retry_s`` seconds have
   passed (then a :class:`~sparseps.errors.DeadlineError` naming that setting);
3. from then on groups every keyed call by the placement (the same compiled dedup and
   group pass, over the placement's owner table);
4. resends the part of a call whose server's connection dropped when the newest
   placement gives that server no shard (it was drained and stopped before this client
   saw a refusal from it).

Table-wide calls go to every live server of the newest placement; sending them again
while servers move shards is :mod:`sparseps.elastic.table_wide`'s. Dense tables stay on
``dense_server_of(name, S)`` of the client's endpoint list (the job's start count).
Placements and ``--replicas`` do not mix (servers refuse to install one), so a client
with replicas holds no placement router.

The client takes this router by injection (:class:`~sparseps.rpc.router.PlacementRouting`
is the contract): this package sits above :mod:`sparseps.rpc` (:mod:`sparseps.layers`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..core.placement import Placement
from ..errors import DeadlineError, RemoteError, SparsePSError, UnavailableError
from ..rpc.keyed import PLACEMENT_REFUSAL, KeyedBatch, KeyedHandle, owner_parts, positions_of
from ..rpc.router import Grouping
from .table_wide import send_table_wide

if TYPE_CHECKING:
    from ..rpc.call import Call
    from ..rpc.channel import Channel
    from ..rpc.protocol import Reply

__all__ = ["PlacementRouter", "PlacedHandle", "is_placement_error"]

_PROBE_TIMEOUT_S = 5.0
# After one server answered get_placement, how long the others may still take (a missed
# newer version only costs another refusal and refresh).
_STRAGGLER_S = 0.25
# How often a wait looks whether its server's connection dropped (a drained server that
# was stopped before this client saw the placement without it).
_DOWN_POLL_S = 0.25


def is_placement_error(exc: BaseException) -> bool:
    """Whether a server refused a request for a placement reason (resend after refresh)."""
    return isinstance(exc, RemoteError) and exc.remote_type == PLACEMENT_REFUSAL


class PlacementRouter:
    """A client's routing by its servers' placement (module docstring).

    Args:
        channel: the client's channel (new servers of a placement are added to it).
        num_servers: the client's endpoints (the first placement is asked of them).
        retry_s: seconds refused requests are resent for (``placement_retry_s``).

    Attributes:
        refreshes: placements asked of the servers so far.
        move_waits: table-wide ops sent again after a refusal during a move.
    """

    def __init__(self, channel: Channel, *, num_servers: int, retry_s: float) -> None:
        self.channel = channel
        self.num_servers = num_servers
        self.retry_s = float(retry_s)
        self.refreshes = 0
        self.move_waits = 0
        self._lock = threading.Lock()
        # (placement, channel rank of each placement rank); read as one attribute
        self._route: tuple[Placement, np.ndarray] | None = None

    @property
    def placement(self) -> Placement | None:
        """The newest placement this router has seen (None: the servers hold none yet)."""
        route = self._route
        return None if route is None else route[0]

    @property
    def route(self) -> tuple[Placement, np.ndarray] | None:
        """The placement and the channel rank of each of its ranks, as one value."""
        return self._route

    def refresh(self) -> Placement | None:
        """Ask the servers this client routes to for their placement and adopt the newest
        (connecting to new servers it names). A server that does not answer is skipped
        while another does. Returns the placement in use (None: the servers hold none)."""
        with self._lock:
            channel, route = self.channel, self._route
            ranks = list(range(self.num_servers)) if route is None else self.live_ranks()
            # The first probe may meet servers still starting (a job's workers start with
            # its servers): it waits for one to answer up to the client's timeout. Later
            # ones skip a silent server fast (_PROBE_TIMEOUT_S) while another answers.
            limit = channel.timeout
            if self.refreshes:
                limit = min(limit, _PROBE_TIMEOUT_S)
            deadline = time.monotonic() + limit
            calls = [channel.submit(rank, "get_placement", None) for rank in ranks]
            best, first_error, answered = None, None, False
            for call in calls:
                try:
                    reply = channel.wait(call, deadline, limit)
                except SparsePSError as exc:
                    channel.forget(call)
                    first_error = first_error or exc
                    continue
                if not answered:  # the rest get a moment: a stopped server is skipped
                    deadline = min(deadline, time.monotonic() + _STRAGGLER_S)
                answered = True
                result: dict = reply.result  # type: ignore[assignment]
                version = int(result.get("version") or 0)
                if version and (best is None or version > best.version):
                    best = Placement.from_wire(result, np.array(reply.bufs[0]))
            if not answered and first_error is not None:
                raise first_error
            self.refreshes += 1
            if best is not None and (route is None or best.version > route[0].version):
                self._route = (best, np.asarray(channel.grow(best.endpoints), np.int64))
            return self.placement

    def live_ranks(self) -> list[int]:
        """Channel ranks of the live servers of the placement (none before one is seen)."""
        route = self._route
        if route is None:
            return []
        return [int(route[1][r]) for r in route[0].live_ranks()]

    # -- Router (sparseps.rpc.router) -----------------------------------------------------

    def group(self, keys: np.ndarray, *, dedup: bool) -> Grouping:
        route = self._placed()
        return Grouping(*route[0].group(keys, dedup=dedup), route=route)

    def send(self, batch: KeyedBatch, grouping: Grouping,
             finish: Callable[[list], object]) -> PlacedHandle:  # fmt: skip
        placement, chan = cast(tuple[Placement, np.ndarray], grouping.route)
        keys, columns = batch.keys, batch.columns
        parts = [
            (part, self.channel.submit(int(chan[owner]), batch.op, batch.table,
                                       [keys[part], *(c[part] for c in columns)]))
            for owner, part in owner_parts(grouping.offsets, int(placement.owners[0]))
        ]  # fmt: skip
        return PlacedHandle(self, batch, parts, finish)

    def table_wide(self, op: str, table: str | None, args: dict | None, *,
                   timeout: float | None, pick: Callable[[Reply], object]) -> list:  # fmt: skip
        return send_table_wide(self, op, table, args, timeout=timeout, pick=pick)

    def server_ranks(self) -> list[int]:
        return self.live_ranks()

    def shard_holders(self) -> list[tuple[int, tuple[int, ...]]]:
        """Each live server holds its own shards (no copies under a placement)."""
        return [(rank, (rank,)) for rank in self.live_ranks()]

    def take_over(self, batch: KeyedBatch, refused: np.ndarray, limit: float) -> list:
        """Send ``batch.keys[refused]``, refused by the servers a plain-routed call went
        to, by the placement's owners; ``[(positions, reply)]`` once all are answered."""
        return self.collect(batch, [], limit, refused=[refused])

    # -- sending again -------------------------------------------------------------------

    def collect(self, batch: KeyedBatch, parts: list, limit: float, *,
                refused: list[np.ndarray] | None = None) -> list:  # fmt: skip
        """Wait for ``parts`` (``[(positions, request)]``) and send again what a server
        refused (or a drained server left unanswered) until every key is answered:
        ``[(positions, reply)]``. ``refused``: positions refused already, sent first.

        Raises:
            DeadlineError: a server did not answer in time, or servers kept refusing keys
                for ``retry_s`` seconds.
            RemoteError / ProtocolError: a server failed the request otherwise.
        """
        channel = self.channel
        deadline = time.monotonic() + limit
        got: list = []
        retry_until, pause = None, 0.002
        try:
            while True:
                if refused is None:
                    refused = self._wait_round(parts, deadline, limit, got)
                if not refused:
                    return got
                now = time.monotonic()
                retry_until = now + self.retry_s if retry_until is None else retry_until
                if now > retry_until:
                    self._kept_refusing(batch, sum(map(len, refused)))
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
                self.refresh()
                parts = self._resend(batch, np.concatenate(refused))
                refused, deadline = None, time.monotonic() + limit
        except BaseException:
            for _, request in parts:  # their late replies are dropped
                channel.forget(request)
            raise

    def _wait_round(self, parts: list, deadline: float, limit: float,
                    got: list) -> list[np.ndarray]:  # fmt: skip
        """Wait for each part; the answered ones go to ``got``, the positions of the ones
        to send again are returned."""
        refused = []
        for positions, request in parts:
            if self._left_behind(request, deadline):
                refused.append(positions_of(positions))  # a drained server, stopped
                continue
            try:
                got.append((positions, self.channel.wait(request, deadline, limit)))
            except RemoteError as exc:
                if not is_placement_error(exc):
                    raise
                refused.append(positions_of(positions))
            except (DeadlineError, UnavailableError):
                if not self._gone(request):
                    raise
                refused.append(positions_of(positions))  # a drained server, stopped
        return refused

    def _kept_refusing(self, batch: KeyedBatch, count: int) -> None:
        placement = self.placement
        raise DeadlineError(
            f"{batch.op} {batch.table!r}: servers kept refusing {count} keys for "
            f"{self.retry_s:g} s (placement version "
            f"{None if placement is None else placement.version}); raise "
            "PSClient(placement_retry_s=...) if a migration takes longer",
            op=batch.op, seconds=self.retry_s, setting="PSClient(placement_retry_s=...)",
        )  # fmt: skip

    def _resend(self, batch: KeyedBatch, todo: np.ndarray) -> list:
        """Send ``batch.keys[todo]`` (unique) grouped by the current placement's owners."""
        placement, chan = self._placed()
        keys, columns = batch.keys, batch.columns
        owners = placement.owner_of(keys[todo])
        order = np.argsort(owners, kind="stable")
        ranks, starts = np.unique(owners[order], return_index=True)
        bounds = [*starts[1:], len(order)]
        out = []
        for rank, lo, hi in zip(ranks, starts, bounds, strict=True):
            positions = todo[order[lo:hi]]
            bufs = [keys[positions], *(c[positions] for c in columns)]
            request = self.channel.submit(int(chan[rank]), batch.op, batch.table, bufs)
            out.append((positions, request))
        return out

    def _placed(self) -> tuple[Placement, np.ndarray]:
        route = self._route
        if route is None:  # a refusal comes only from a server that holds a placement
            raise UnavailableError(
                "the servers refused keys for a placement reason, but none answered "
                "get_placement with a placement; retry, or check the job's servers"
            )
        return route

    def _left_behind(self, request: Call, deadline: float) -> bool:
        """Wait for ``request``'s reply while its server's connection is up; when it is
        down, whether the server was drained out of the job (then the request is dropped
        and its part resent)."""
        channel = self.channel
        while not channel.settled(request, _DOWN_POLL_S) and time.monotonic() < deadline:
            if not channel.connected(request.rank) and self._gone(request):
                channel.forget(request)
                return True
        return False

    def _gone(self, request: Call) -> bool:
        """After ``request`` got no answer: whether its server was drained out of the job
        (the newest placement gives it no shard). A client that missed the drain's
        refusals learns it this way, once, at the cost of one timeout."""
        try:
            newest = self.refresh()
        except SparsePSError:
            return False
        return newest is not None and request.rank not in self.live_ranks()


class PlacedHandle(KeyedHandle):
    """The requests of one keyed call sent by placement; ``wait()`` resends what a server
    refused for a placement reason (after a refresh) and returns the call's result.

    Waiting is serialised (one thread drives the resends; the others then read the kept
    result), so a refused part is sent again once.
    """

    def __init__(self, router: PlacementRouter, batch: KeyedBatch, parts: list,
                 finish: Callable[[list], object]) -> None:  # fmt: skip
        super().__init__(router.channel, batch, parts, finish)
        self._router = router
        self._parts = list(parts)

    def wait(self, timeout: float | None = None) -> Any:
        """The result (rows for a pull, None for a push).

        Raises:
            DeadlineError: a server did not answer in time, or servers kept refusing
                keys for ``placement_retry_s`` seconds.
            RemoteError / ProtocolError: as :meth:`Handle.wait <sparseps.rpc.handle.Handle.wait>`.
        """
        return super().wait(timeout)

    def _collect(self, timeout: float | None) -> tuple[object, BaseException | None]:
        channel = self._router.channel
        limit = channel.timeout if timeout is None else float(timeout)
        try:
            return self._finish(self._router.collect(self.batch, self._parts, limit)), None
        except Exception as exc:
            return None, self._failed(channel, [], exc)
