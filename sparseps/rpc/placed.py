"""Placement routing of :class:`~sparseps.rpc.client.PSClient`: elastic jobs (issue 23).

A job turns elastic when its servers get a placement (:mod:`sparseps.core.placement`,
installed by ``sparseps scale`` or :func:`sparseps.elastic.install_placement`). Until
then a client routes by ``server_of(key, S)`` over its endpoint list, the code path of
every job that never scales. A server holding a placement refuses keys of virtual shards
it does not own (or is handing over) with ``PlacementError``, applying nothing; the
client then:

1. fetches the placement from the servers it knows (``get_placement``, the highest
   version wins), connecting to the endpoints of new servers it names;
2. resends only the refused part, grouped by the new owners, after a short back-off
   (2 ms doubling to 50 ms), until ``placement_retry_s`` seconds have passed (then a
   :class:`~sparseps.errors.DeadlineError` naming that setting);
3. from then on groups every keyed call by the placement (the same compiled dedup and
   group pass, over the placement's owner table).

Table-wide calls (create_table, save, load, decay, shrink, stats, save_inference, ...)
first ask the servers for the newest placement, then go to every live server of it (a
drained server is not contacted); sending them again while servers move shards is
:mod:`sparseps.rpc.table_wide`'s. Dense tables stay on ``dense_server_of(name, S)`` of
the client's endpoint list (the job's start count). Placements and ``--replicas`` do not
mix (servers refuse to install one), so the placement path never meets replicas.

:class:`RoutedHandle` is the one home of "send by owner, resend what was refused";
``ElasticClient`` (:mod:`sparseps.elastic.client`) is a PSClient that requires a
placement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.placement import Placement
from ..core.routing import group_by_server, route_by_server
from ..errors import DeadlineError, ProtocolError, RemoteError, SparsePSError, UnavailableError
from .client_parts import ClientParts
from .handle import Handle
from .replicated import ShardRequest

if TYPE_CHECKING:
    from .channel import Call
    from .protocol import Reply

__all__ = [
    "DEFAULT_PLACEMENT_RETRY_S",
    "PlacementRouting",
    "RoutedHandle",
    "is_placement_error",
    "rows_of",
]

DEFAULT_PLACEMENT_RETRY_S = 60.0
_PROBE_TIMEOUT_S = 5.0
# After one server answered get_placement, how long the others may still take (a missed
# newer version only costs another refusal and refresh).
_STRAGGLER_S = 0.25
# How often a wait looks whether its server's connection dropped (a drained server that
# was stopped before this client saw the placement without it).
_DOWN_POLL_S = 0.25


def is_placement_error(exc: BaseException) -> bool:
    """Whether a server refused a request for a placement reason (resend after refresh)."""
    return isinstance(exc, RemoteError) and exc.remote_type == "PlacementError"


class PlacementRouting(ClientParts):
    """Placement state and routing, mixed into :class:`~sparseps.rpc.client.PSClient`."""

    def _init_placement(self, *, follow: bool, retry_s: float) -> None:
        self._follow = bool(follow)
        self.placement_retry_s = float(retry_s)
        self.refreshes = 0
        self.move_waits = 0  # table-wide ops sent again after a refusal during a move
        self._placement_lock = threading.Lock()
        # (placement, channel rank of each placement rank); read as one attribute
        self._routing: tuple[Placement, np.ndarray] | None = None

    @property
    def placement(self) -> Placement | None:
        """The newest placement this client has seen (None: plain routing)."""
        routing = self._routing
        return None if routing is None else routing[0]

    def refresh_placement(self) -> Placement | None:
        """Ask the servers this client routes to for their placement and adopt the newest
        (connecting to new servers it names). A server that does not answer is skipped
        while another does. Returns the placement in use (None: plain routing)."""
        with self._placement_lock:
            channel, routing = self._channel, self._routing
            if routing is None:
                ranks = list(range(self.num_servers))
            else:
                ranks = [int(routing[1][r]) for r in routing[0].live_ranks()]
            # The first probe may meet servers still starting (a job's workers start with
            # its servers): it waits for one to answer up to the client's timeout. Later
            # ones skip a silent server fast (_PROBE_TIMEOUT_S) while another answers.
            limit = self.timeout if self.refreshes == 0 else min(self.timeout, _PROBE_TIMEOUT_S)
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
            if best is not None and (routing is None or best.version > routing[0].version):
                chan = np.asarray(channel.grow(best.endpoints), np.int64)
                self._routing = (best, chan)
            return self.placement

    def _probe_placement(self) -> None:
        """Before a table-wide op: take the newest placement (the servers it reaches)."""
        if self._follow and not self.replicas:
            self.refresh_placement()

    def _table_ranks(self) -> list[int] | None:
        """Channel ranks of the live servers of the placement (None: plain routing)."""
        routing = self._routing
        if routing is None:
            return None
        return [int(routing[1][r]) for r in routing[0].live_ranks()]

    def _left_behind(self, request, deadline: float) -> bool:
        """Wait for ``request``'s reply while its server's connection is up; when it is
        down, whether the server was drained out of the job (then the request is dropped
        and its part resent). A plain-routed request is only waited for by the caller."""
        if self._routing is None or isinstance(request, ShardRequest):
            return False
        channel = self._channel
        while not channel.settled(request, _DOWN_POLL_S) and time.monotonic() < deadline:
            if not channel.connected(request.rank) and self._gone(request):
                channel.forget(request)
                return True
        return False

    def _gone(self, request) -> bool:
        """After ``request`` got no answer: whether its server was drained out of the job
        (the newest placement gives it no shard). A client that missed the drain's
        refusals learns it this way, once, at the cost of one timeout."""
        routing = self._routing
        if not self._follow or routing is None or isinstance(request, ShardRequest):
            return False
        try:
            newest = self.refresh_placement()
        except SparsePSError:
            return False
        routing = self._routing
        if newest is None or routing is None:
            return False
        return request.rank not in {int(routing[1][r]) for r in newest.live_ranks()}

    def _send_keyed(self, op: str, table: str, grouped: np.ndarray, offsets: np.ndarray,
                    columns: Sequence[np.ndarray], routing) -> list:  # fmt: skip
        """One request per owner with keys (one to the first owner when there are none):
        ``[(positions, request)]``; ``routing`` None: by shard (``server_of``)."""
        if not len(grouped):
            owners = [0 if routing is None else int(routing[0].owners[0])]
        elif len(offsets) == 2:  # one owner holds every key (one server)
            owners = [0]
        else:
            owners = np.flatnonzero(np.diff(offsets)).tolist()
        out: list = []
        for owner in owners:
            lo, hi = int(offsets[owner]), int(offsets[owner + 1])
            bufs = [grouped[lo:hi], *(c[lo:hi] for c in columns)]
            request: Call | ShardRequest
            if routing is None:
                request = self._shard_request(owner, op, table, bufs)
            else:
                request = self._channel.submit(int(routing[1][owner]), op, table, bufs)
            out.append((slice(lo, hi), request))
        return out

    def _resend(self, op: str, table: str, keys: np.ndarray, columns: Sequence[np.ndarray],
                todo: np.ndarray) -> list:  # fmt: skip
        """Send ``keys[todo]`` (unique) grouped by the current placement's owners."""
        routing = self._routing
        assert routing is not None, "a refusal comes only from a server with a placement"
        placement, chan = routing
        owners = placement.owner_of(keys[todo])
        order = np.argsort(owners, kind="stable")
        ranks, starts = np.unique(owners[order], return_index=True)
        bounds = [*starts[1:], len(order)]
        out = []
        for rank, lo, hi in zip(ranks, starts, bounds, strict=True):
            positions = todo[order[lo:hi]]
            bufs = [keys[positions], *(c[positions] for c in columns)]
            out.append((positions, self._channel.submit(int(chan[rank]), op, table, bufs)))
        return out

    def _keyed(self, op: str, table: str, group: tuple, columns: Sequence[np.ndarray],
               finish: Callable[[list], object]) -> RoutedHandle:  # fmt: skip
        """Send a keyed op: ``group`` = :meth:`_group`'s answer, ``columns`` aligned with
        its grouped keys; ``finish`` gets ``[(positions, reply)]``."""
        grouped, offsets, _, routing = group
        parts = self._send_keyed(op, table, grouped, offsets, columns, routing)
        return RoutedHandle(
            self, op, table, keys=grouped, columns=columns, parts=parts, finish=finish
        )

    def _group(self, keys: np.ndarray, *, dedup: bool = True) -> tuple:
        """Group ``keys`` by owner, deduplicated or as they are: ``(grouped, offsets,
        inverse, routing)`` (``inverse`` None: ``grouped`` is ``keys``)."""
        routing = self._routing
        inverse: np.ndarray | None
        if routing is not None:
            grouped, offsets, inverse = routing[0].group(keys, dedup=dedup)
        elif dedup:
            grouped, offsets, inverse = group_by_server(keys, self.num_servers)
        else:
            grouped, offsets, inverse = route_by_server(keys, self.num_servers)
        return grouped, offsets, inverse, routing


class RoutedHandle(Handle):
    """The requests of one keyed call, one per owner; ``wait()`` resends what a server
    refused for a placement reason (after a refresh) and returns the call's result.

    Waiting is serialised (one thread drives the resends; the others then read the
    kept result), so a refused part is sent again once.
    """

    def __init__(self, client: PlacementRouting, op: str, table: str, *, keys: np.ndarray,
                 columns: Sequence[np.ndarray], parts: list,
                 finish: Callable[[list], object]) -> None:  # fmt: skip
        super().__init__(client._channel, [request for _, request in parts], finish)
        self._client, self._op, self._table = client, op, table
        self._keys, self._columns = keys, columns
        self._positions = [positions for positions, _ in parts]

    def wait(self, timeout: float | None = None) -> Any:
        """The result (rows for a pull, None for a push).

        Raises:
            DeadlineError: a server did not answer in time, or servers kept refusing
                keys for ``placement_retry_s`` seconds.
            RemoteError / ProtocolError: as :meth:`Handle.wait <sparseps.rpc.handle.Handle.wait>`.
        """
        return super().wait(timeout)

    def _settle(self, timeout: float | None) -> None:
        # One thread at a time: the first drives the resends, later ones keep its outcome.
        with self._lock:
            if not self._done:
                self._keep(*self._collect(timeout))

    def _collect(self, timeout: float | None) -> tuple[object, BaseException | None]:
        client = self._client
        channel = client._channel
        limit = channel.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        got: list[tuple[object, Reply]] = []
        parts = list(zip(self._positions, self._calls, strict=True))
        retry_until, pause = None, 0.002
        try:
            while True:
                refused = []
                for positions, request in parts:
                    if client._left_behind(request, deadline):
                        refused.append(_indices(positions))  # a drained server, stopped
                        continue
                    try:
                        got.append((positions, self._reply(channel, request, deadline, limit)))
                    except RemoteError as exc:
                        if not (client._follow and is_placement_error(exc)):
                            raise
                        refused.append(_indices(positions))
                    except (DeadlineError, UnavailableError):
                        if not client._gone(request):
                            raise
                        refused.append(_indices(positions))  # a drained server, stopped
                if not refused:
                    return self._finish(got), None
                now = time.monotonic()
                retry_until = now + client.placement_retry_s if retry_until is None else retry_until
                if now > retry_until:
                    count = sum(map(len, refused))
                    placement = client.placement
                    raise DeadlineError(
                        f"{self._op} {self._table!r}: servers kept refusing {count} keys for "
                        f"{client.placement_retry_s:g} s (placement version "
                        f"{None if placement is None else placement.version}); raise "
                        "PSClient(placement_retry_s=...) if a migration takes longer",
                        op=self._op, seconds=client.placement_retry_s,
                        setting="PSClient(placement_retry_s=...)",
                    )  # fmt: skip
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
                client.refresh_placement()
                parts = client._resend(self._op, self._table, self._keys, self._columns,
                                       np.concatenate(refused))  # fmt: skip
                deadline = time.monotonic() + limit
        except Exception as exc:
            return None, self._failed(channel, [request for _, request in parts], exc)


def _indices(positions) -> np.ndarray:
    if isinstance(positions, slice):
        return np.arange(positions.start, positions.stop, dtype=np.int64)
    return positions


def rows_of(count: int, inverse: np.ndarray | None) -> Callable[[list], np.ndarray]:
    """The ``finish`` of a pull: every owner's rows in grouped order, then the caller's
    (``inverse`` None: the grouped order is the caller's). Always a new, writable array:
    one owner's rows in the caller's order are the reply's own frame, handed over (the
    decoder marks reply buffers read-only; this call is the frame's only user, so it
    may be written), which saves a copy of every row (~40 µs per 512 KiB)."""

    def finish(got: list) -> np.ndarray:
        for positions, reply in got:  # a reply is remote input (its schema: 2-D float32)
            asked = len(range(count)[positions]) if isinstance(positions, slice) else len(positions)
            if reply.bufs[0].shape[0] != asked:
                raise ProtocolError(
                    f"a server answered {reply.bufs[0].shape[0]} rows for {asked} keys "
                    "(a server of another sparseps version?)"
                )
        if len(got) == 1 and got[0][0] == slice(0, count):
            rows = got[0][1].bufs[0]
            if inverse is not None:
                return np.take(rows, inverse, axis=0)
            try:
                rows.flags.writeable = True  # a received frame's memory is the receiver's
            except ValueError:  # a read-only buffer (not a received frame): copy it
                return rows.copy()
            return rows
        rows = np.empty((count, got[0][1].bufs[0].shape[1]), dtype=np.float32)
        for positions, reply in got:
            rows[positions] = reply.bufs[0]
        return rows if inverse is None else np.take(rows, inverse, axis=0)

    return finish
