"""Table-wide ops of a client under a placement: every live server, again after a move.

The placement router's (:mod:`sparseps.elastic.routing`; the keyed routing and the
placement itself are there). A table-wide call (create_table, save, load, decay, shrink,
stats, save_inference, ...) goes to every live server of the newest placement. A server
in a move refuses decay, shrink, save, load, save_inference and commit_inference
(``MoveInProgressError``, nothing applied): the client sends them again, after a refresh,
to the servers that refused and to servers that became live meanwhile, with a back-off
(2 ms doubling to 50 ms), for up to ``placement_retry_s`` seconds. One that raced the
start of a move (a server of it applied the op before its ``move_begin``) is sent again
whole when that is harmless (:data:`REDO_OPS`), else :class:`MoveRaceError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..core.placement import Placement
from ..errors import DeadlineError, RemoteError, SparsePSError
from ..rpc.ops import PLACED_OPS

if TYPE_CHECKING:
    from ..rpc.channel import Channel
    from ..rpc.protocol import Reply

__all__ = ["REDO_OPS", "MoveRaceError", "PlacedServers", "is_move_in_progress", "send_table_wide"]

# the remote type of sparseps.elastic.server_moves.MoveInProgressError (no import upwards)
MOVE_IN_PROGRESS = "MoveInProgressError"
# table-wide ops a client may send again whole when one raced the start of a move (each
# rewrites what it writes: files, a restored shard, a reset marker)
REDO_OPS = frozenset({"save", "load", "save_inference", "commit_inference"})


class MoveRaceError(SparsePSError):
    """A decay or shrink reached some servers of a migration before it began there and
    others after (they refused it): the moved rows got it twice or not at all."""


def is_move_in_progress(exc: BaseException) -> bool:
    """Whether a server refused a table-wide op because it is in a move (send it again)."""
    return isinstance(exc, RemoteError) and exc.remote_type == MOVE_IN_PROGRESS


class PlacedServers(Protocol):
    """What a table-wide op needs of the placement router."""

    channel: Channel
    retry_s: float
    move_waits: int

    @property
    def placement(self) -> Placement | None: ...

    @property
    def route(self) -> tuple[Placement, np.ndarray] | None: ...

    def live_ranks(self) -> list[int]: ...

    def refresh(self) -> Placement | None: ...


def send_table_wide(servers: PlacedServers, op: str, table: str | None, args: dict | None, *,
                    timeout: float | None, pick: Callable[[Reply], object]) -> list:  # fmt: skip
    """Send a table-wide op to every live server of the placement; servers that refuse
    it while in a move get it again (with servers that became live meanwhile) once the
    move ended. ``pick(reply)`` of each server that applied it, in no set order.

    An op that raced the start of a move (a server of the move applied it before its
    ``move_begin`` while another refused it) is sent again whole when repeating it is
    harmless (save, load, inference saves: :data:`REDO_OPS`); a decay or shrink raises
    :class:`MoveRaceError`.

    Raises:
        DeadlineError: servers kept refusing for ``placement_retry_s`` seconds.
        MoveRaceError: a decay or shrink raced the start of a move.
    """
    retry_until = time.monotonic() + servers.retry_s
    while True:
        out, raced = _send_once(servers, op, table, args, timeout, pick, retry_until)
        if not raced:
            return out
        if op not in REDO_OPS:
            raise MoveRaceError(
                f"{op} {table!r} raced the start of a migration: servers of the move "
                f"{raced} applied it before the move began while others refused it, so "
                "the moved rows got it twice or not at all; issue table-wide ops "
                "between migrations (or from the process that drives them)"
            )
        servers.move_waits += 1  # a save/load: the whole op again, after the move


def _send_once(servers: PlacedServers, op: str, table: str | None, args: dict | None,
               timeout: float | None, pick: Callable, retry_until: float
               ) -> tuple[list, list[int]]:  # fmt: skip
    """One pass of :func:`send_table_wide`: ``(picked, raced)``, ``raced`` the channel
    ranks that applied the op and whose shards changed before it completed."""
    channel = servers.channel
    todo = servers.live_ranks()
    contacted: set[int] = set()
    out: list = []
    applied: list[tuple[int, Placement | None]] = []  # (channel rank, its placement then)
    refusals, pause = 0, 0.002
    while True:
        limit = channel.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        sent_at = servers.placement
        # sent with its placement version: a server of another version refuses it, so
        # each server that applies it does so under ``sent_at`` (see _raced)
        placed = dict(args or {})
        if sent_at is not None and op in PLACED_OPS:
            placed["placement_version"] = sent_at.version
        calls = [(rank, channel.submit(rank, op, table, (), placed)) for rank in todo]
        contacted.update(todo)
        refused, error = [], None
        for rank, call in calls:
            try:
                out.append(pick(channel.wait(call, deadline, limit)))
                applied.append((rank, sent_at))
            except SparsePSError as exc:
                channel.forget(call)
                if is_move_in_progress(exc):
                    refused.append(rank)
                elif error is None:
                    error = exc
        if error is not None:
            raise error
        if not refused:
            return out, (_raced(servers, applied) if refusals else [])
        refusals += 1
        servers.move_waits += 1
        if time.monotonic() > retry_until:
            raise DeadlineError(
                f"{op} {table!r}: servers {refused} kept refusing it for "
                f"{servers.retry_s:g} s while moving virtual shards (a migration "
                "that does not end: re-run it); raise PSClient(placement_retry_s=...) "
                "if a migration takes longer",
                op=op, seconds=servers.retry_s, setting="PSClient(placement_retry_s=...)",
            )  # fmt: skip
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        servers.refresh()
        live = set(servers.live_ranks())
        # a refused server drained by the move holds nothing now: its rows went to
        # servers of the move, which refused too or were not live before
        todo = sorted((set(refused) & live) | (live - contacted))


def _raced(servers: PlacedServers, applied: list[tuple[int, Placement | None]]) -> list[int]:
    """After refusals: the servers that applied the op and own other shards now (they
    were in the move, and took the op before it began there)."""
    servers.refresh()
    route = servers.route
    if route is None:
        return []
    final, chan = route
    rank_of = {int(c): r for r, c in enumerate(chan)}
    raced = []
    for channel_rank, then in applied:
        rank = rank_of.get(channel_rank)
        if then is None or rank is None or rank >= len(then.endpoints):
            continue
        if not np.array_equal(then.owners == rank, final.owners == rank):
            raced.append(channel_rank)
    return raced
