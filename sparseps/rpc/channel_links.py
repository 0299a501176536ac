"""A :class:`~sparseps.rpc.channel.Channel`'s connections to its servers, over their life.

One DEALER socket per server rank, and its monitor socket: connecting (and the heartbeats
of a replicated job), sending a request on its server's DEALER or queueing it while zmq
cannot take it yet, the monitor's events (connected, handshake failed, connection lost),
why a server refused the handshake, a server lost (its calls fail at once, its socket is
closed so nothing queued for it reaches a later process on the same port), reconnecting to
a replacement (:meth:`ServerLinks.revive`) and connecting to an elastic job's new servers
(:meth:`ServerLinks.grow`). The sockets change only on the channel's I/O thread, holding
the socket lock; callers queue what they want done and wait for it.

The channel holds one :class:`ServerLinks` beside the book of waiting calls
(:class:`~sparseps.rpc.call.PendingCalls`) and the readers of replies
(:mod:`.channel_receive`), which read the DEALERs this object keeps (:attr:`dealers`,
:attr:`descriptors`).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import DeadlineError
from . import transport
from .protocol import peek_request_id
from .security import handshake_failed_events

if TYPE_CHECKING:
    from .call import Call, PendingCalls
    from .protocol import Limits
    from .security import Security

__all__ = ["HEARTBEAT_IVL_MS", "HEARTBEAT_TIMEOUT_MS", "ServerLinks"]

log = logging.getLogger("sparseps.rpc.channel")  # the channel's log lines, as before

_EVENTS = {
    zmq.EVENT_CONNECTED: "connected",
    zmq.EVENT_DISCONNECTED: "connection lost",
    zmq.EVENT_CONNECT_RETRIED: "cannot connect (refused or unresolvable), retrying",
    zmq.EVENT_CLOSED: "closed",
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "connected",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "authentication failed",
}
_HANDSHAKE_FAILED = handshake_failed_events()
# Replicated jobs: a server silent this long (no heartbeat answer) is lost; its zmq I/O
# thread answers heartbeats even while its Python handlers are busy, so a slow server is
# not mistaken for a dead one.
HEARTBEAT_IVL_MS = 500
HEARTBEAT_TIMEOUT_MS = 3000


class ServerLinks:
    """The DEALER of every server rank and what is known of its connection.

    Args:
        endpoints: ``host:port`` per server rank (grows with :meth:`grow`).
        role: what the peers are, in messages.
        limits: message size limits (the sockets' receive bound).
        security: the job's CURVE keys (None: plain transport).
        detect_loss: a dropped connection makes its server lost (``Channel(detect_loss=)``).
        context: the zmq context of the sockets.
        io: the socket lock: every use of a DEALER holds it.
        calls: the channel's waiting calls (a lost or refusing server fails its own).
        fail: marks a call (taken out of ``calls``) unavailable, saying why, and wakes it.
        nudge: wakes the I/O thread (a revive, a loss or new servers asked for).

    Attributes:
        dealers: the DEALER of each rank (read by the waiting readers, socket lock held).
        descriptors: each live DEALER's notification descriptor (``zmq.FD``) -> its rank.
        version: bumped whenever :attr:`descriptors` changes.
        poller: the I/O thread's poller (the monitor sockets).
        closed: the sockets are closed (the channel closed).
    """

    def __init__(self, endpoints: Sequence[str], *, role: str, limits: Limits,
                 security: Security | None, detect_loss: bool, context: zmq.Context,
                 io: threading.Lock, calls: PendingCalls,
                 fail: Callable[[Call, str | None], None],
                 nudge: Callable[[], None]) -> None:  # fmt: skip
        self.endpoints = tuple(endpoints)
        self.role, self.limits, self.security = role, limits, security
        self.detect_loss = detect_loss
        self._context, self._io, self._calls = context, io, calls
        self._fail, self._nudge = fail, nudge
        self.poller = zmq.Poller()
        self.descriptors: dict[int, int] = {}
        self.version = 0
        self.closed = False
        self._monitor_of: dict[zmq.Socket, int] = {}
        count = len(self.endpoints)
        # rank -> why it is lost (None: not lost); written by the I/O thread (socket lock)
        self._lost: list[str | None] = [None] * count
        self._was_connected = [False] * count
        self._why_lost: list[str] = [""] * count
        self._state = ["connecting"] * count
        # rank -> why its server refused our handshake (None: not refused); set and
        # cleared by the I/O thread from monitor events, read by senders in send (both
        # under the socket lock, as _lost and the backlogs are).
        self._refused: list[str | None] = [None] * count
        # rank -> requests zmq could not take yet (no usable connection: still connecting,
        # or torn down by a failed handshake whose monitor event has not arrived yet).
        # The I/O thread sends them when it can, fails them when the server refuses us,
        # and drops those whose callers gave up (their wait is bounded by the timeout).
        self._backlog: list[collections.deque] = [collections.deque() for _ in range(count)]
        self.dealers: list[zmq.Socket] = []
        self._monitors: list[zmq.Socket] = []
        for rank in range(count):
            dealer, monitor = self._connect(rank)
            self.dealers.append(dealer)
            self._monitors.append(monitor)
        # ranks a caller asked to reconnect (revive) or to count as lost (mark_lost: -1 -
        # rank), and endpoints a caller asked to add (grow), served by the I/O thread
        self._revive: collections.deque[tuple[int, threading.Event]] = collections.deque()
        self._growth: collections.deque[tuple[list[str], threading.Event]] = collections.deque()
        self._grow_lock = threading.Lock()

    # -- what callers ask --------------------------------------------------------------

    def revive(self, rank: int, timeout: float = 10.0) -> None:
        """Connect again to a lost server ``rank`` (a replacement now serves there).

        Raises:
            DeadlineError: the I/O thread did not get to it within ``timeout``.
        """
        if self._lost[rank] is None:
            return
        done = threading.Event()
        self._revive.append((rank, done))
        self._nudge()
        if not done.wait(timeout):
            raise DeadlineError(
                f"reconnecting to {self.role} {rank} at {self.endpoints[rank]} took over {timeout:g} s",
                op="revive", role=self.role, rank=rank, address=self.endpoints[rank],
                seconds=timeout, setting="Channel.revive(timeout=...)",
            )  # fmt: skip

    def grow(self, endpoints: Sequence[str], timeout: float = 10.0) -> list[int]:
        """The ranks of ``endpoints`` on this channel, connecting to the ones it does not
        have yet as new ranks (an elastic job's new servers; the I/O thread connects).

        Raises:
            ConfigError: a malformed ``host:port``.
            DeadlineError: the I/O thread did not get to it within ``timeout``.
        """
        from ..env import parse_endpoint

        with self._grow_lock:
            new = [e for e in dict.fromkeys(endpoints) if e not in self.endpoints]
            for endpoint in new:
                parse_endpoint(endpoint, what="placement endpoint")
            if new:
                done = threading.Event()
                self._growth.append((new, done))
                self._nudge()
                if not done.wait(timeout):
                    raise DeadlineError(
                        f"connecting to new {self.role}s {new} took over {timeout:g} s",
                        op="grow", role=self.role, address=new[0], seconds=timeout,
                        setting="Channel.grow(timeout=...)",
                    )  # fmt: skip
            index = {e: i for i, e in enumerate(self.endpoints)}
        return [index[e] for e in endpoints]

    def mark_lost(self, rank: int, why: str, timeout: float = 10.0) -> None:
        """Treat server ``rank`` as lost (it does not answer: a port nobody serves any
        more); done by the I/O thread, which this waits for (at most ``timeout`` s)."""
        if self._lost[rank] is None:
            done = threading.Event()
            self._why_lost[rank] = why
            self._revive.append((-1 - rank, done))
            self._nudge()
            done.wait(timeout)

    def connected(self, rank: int) -> bool:
        """Whether the connection to server ``rank`` is up (as its monitor last said)."""
        return self._state[rank] == "connected"

    def refusing(self, rank: int) -> bool:
        """Whether server ``rank``'s port refused the last connection attempt (nothing
        listens there, as its monitor last said)."""
        return self._state[rank] == _EVENTS[zmq.EVENT_CONNECT_RETRIED]

    def lost(self, rank: int) -> str | None:
        """Why server ``rank`` is lost (``detect_loss``), or None."""
        return self._lost[rank]

    def state(self, rank: int) -> str:
        """The connection to server ``rank`` as its monitor last said (for messages)."""
        return self._state[rank]

    # -- sending (a caller, socket lock held) -------------------------------------------

    def send(self, call: Call, frames: list) -> None:
        """Send ``call``'s frames on its server's DEALER, or queue them while zmq cannot
        take them; fail the call at once when its server is lost or refuses us."""
        rank = call.rank
        if self._lost[rank] is not None or self._refused[rank] is not None:
            # Fail at once rather than queue behind a handshake that keeps failing.
            self.fail_if_pending(call, self._lost[rank] or self._refused[rank])
            return
        backlog = self._backlog[rank]
        if backlog:  # keep the order of requests to one server
            backlog.append(frames)
            return
        try:
            transport.send_frames(self.dealers[rank], frames, flags=zmq.NOBLOCK)
        except zmq.Again:  # no usable connection yet: the I/O thread sends it later
            backlog.append(frames)

    def fail_if_pending(self, call: Call, why: str | None) -> None:
        """Fail ``call`` as unavailable unless it was answered or given up already."""
        if self._calls.take(call.id) is not None:
            self._fail(call, why)

    # -- the I/O thread (socket lock held) -----------------------------------------------

    def watch_all(self) -> None:
        """Watch every server (the I/O thread, as it starts)."""
        for rank in range(len(self.dealers)):
            self._watch(rank)

    def serve_requests(self) -> None:
        """Do what callers queued: revivals, losses, new servers."""
        self._serve_revivals()
        self._serve_growth()

    def on_ready(self, ready: object) -> None:
        """Handle the event waiting on what the poller found ``ready``, when it is a
        server's monitor socket (the poller also watches the channel's wake-up pipe)."""
        rank = self._monitor_of.get(ready)  # type: ignore[call-overload]
        if rank is not None:
            monitor = cast(zmq.Socket, ready)
            if not monitor.closed:
                self._on_event(rank, recv_monitor_message(monitor))

    def flush_backlogs(self) -> None:
        """Send what zmq could not take before; fail it if the server refused us."""
        for rank, backlog in enumerate(self._backlog):
            while backlog:
                frames = backlog[0]
                call_id = peek_request_id(frames[:1])
                if call_id is None or call_id not in self._calls:  # its caller gave up
                    backlog.popleft()
                    continue
                if self._refused[rank] is not None:
                    backlog.popleft()
                    call = self._calls.take(call_id)
                    if call is not None:
                        self._fail(call, self._refused[rank])
                    continue
                try:
                    transport.send_frames(self.dealers[rank], frames, flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                backlog.popleft()

    def close_sockets(self) -> None:
        """Close every socket (the channel is closing; the I/O thread has stopped)."""
        self.closed = True
        for sock in [*self._monitors, *self.dealers]:
            sock.close(linger=0)

    # -- internals ---------------------------------------------------------------------

    def _connect(self, rank: int) -> tuple[zmq.Socket, zmq.Socket]:
        """A new DEALER to server ``rank`` and its monitor socket."""
        sock = transport.new_dealer(
            self._context, self.limits.max_message_bytes, security=self.security
        )
        if self.detect_loss:
            sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        monitor = sock.get_monitor_socket(events=sum(_EVENTS))
        sock.connect(transport.connect_address(self.endpoints[rank]))
        return sock, monitor

    def _serve_growth(self) -> None:
        while self._growth:
            new, done = self._growth.popleft()
            for endpoint in new:
                if endpoint in self.endpoints:
                    continue
                rank = len(self.endpoints)
                self._lost.append(None)
                self._refused.append(None)
                self._was_connected.append(False)
                self._why_lost.append("")
                self._state.append("connecting")
                self._backlog.append(collections.deque())
                self.endpoints = (*self.endpoints, endpoint)
                dealer, monitor = self._connect(rank)
                self.dealers.append(dealer)
                self._monitors.append(monitor)
                self._watch(rank)
                log.info("%s %d at %s: connecting (a new server of the job)", self.role, rank,
                         endpoint)  # fmt: skip
            done.set()

    def _serve_revivals(self) -> None:
        while self._revive:
            rank, done = self._revive.popleft()
            if rank < 0:  # mark_lost
                if self._lost[-1 - rank] is None:
                    self._lose(-1 - rank, self._why_lost[-1 - rank])
            elif self._lost[rank] is not None:
                dealer, monitor = self._connect(rank)
                self.dealers[rank], self._monitors[rank] = dealer, monitor
                self._watch(rank)
                self._was_connected[rank] = False
                self._state[rank] = "connecting"
                self._lost[rank] = None
                log.info("server %d at %s: connecting again", rank, self.endpoints[rank])
            done.set()

    def _watch(self, rank: int) -> None:
        """Watch server ``rank``: its monitor here, its DEALER's descriptor for the waiting
        threads that read replies."""
        self.descriptors[self._descriptor(rank)] = rank
        self.version += 1
        self._monitor_of[self._monitors[rank]] = rank
        self.poller.register(self._monitors[rank], zmq.POLLIN)

    def _unwatch(self, rank: int) -> None:
        """Stop watching server ``rank`` (before its sockets are closed)."""
        self.descriptors.pop(self._descriptor(rank), None)
        self.version += 1
        self._monitor_of.pop(self._monitors[rank], None)
        self.poller.unregister(self._monitors[rank])

    def _descriptor(self, rank: int) -> int:
        return cast(int, self.dealers[rank].getsockopt(zmq.FD))

    def _on_event(self, rank: int, event: Mapping[str, Any]) -> None:
        kind = event["event"]
        self._state[rank] = _EVENTS.get(kind, self._state[rank])
        if kind == zmq.EVENT_CONNECTED:
            self._was_connected[rank] = True
        elif (
            kind == zmq.EVENT_DISCONNECTED
            and self.detect_loss
            and self._was_connected[rank]
            and self._refused[rank] is None
            and self._lost[rank] is None
        ):
            self._lose(rank)
            return
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self._refused[rank] is not None:
                log.info("server %d at %s accepted the handshake", rank, self.endpoints[rank])
            self._refused[rank] = None
        elif kind & _HANDSHAKE_FAILED:
            if self.security is None and kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # Not a refusal: a plain client meeting a CURVE server gets a PROTOCOL
                # event (mechanism mismatch); NO_DETAIL carries the errno of a connection
                # that broke mid-handshake (the server's process died as we connected).
                # zmq reconnects as after any dropped connection; calls wait as usual.
                log.info(
                    "%s %d at %s: the connection broke during the handshake (errno %s); "
                    "reconnecting", self.role, rank, self.endpoints[rank], event["value"],
                )  # fmt: skip
                return
            first = self._refused[rank] is None
            self._refused[rank] = self._refusal(rank, kind, event["value"])
            if first:  # zmq retries every reconnect interval: say it once
                log.error("%s", self._refused[rank])
            self._fail_rank(rank, self._refused[rank])

    def _refusal(self, rank: int, kind: int, value: int) -> str:
        """Why server ``rank`` refused us, and what to do about it."""
        where = f"{self.role} {rank} at {self.endpoints[rank]}"
        if self.security is None:
            # A plain client meets a CURVE server: mechanism mismatch (PROTOCOL event).
            return (
                f"authentication failed: {where} requires the job's key (a --secure job) and "
                f"this client has none; set SPARSEPS_SECURE=1 and SPARSEPS_KEY_DIR to the job's "
                f"key folder, or pass PSClient(security=...) (zmq handshake event {kind:#x}, {value})"
            )
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            detail = "the server refused this client's key"
        else:  # the server could not decrypt our hello: another key, or a plain server
            detail = "the server has another key, or runs without --secure"
        return (
            f"authentication failed: {where}: this client's key is not the job's key ({detail}); "
            f"check SPARSEPS key dir {self.security.key_dir or '(in-memory keys)'} "
            f"(SPARSEPS_KEY_DIR) holds the same keys as the job's servers "
            f"(zmq handshake event {kind:#x}, {value})"
        )

    def _lose(self, rank: int, why: str | None = None) -> None:
        """Server ``rank`` dropped its connection: fail what waits for it, close its socket
        (zmq would otherwise deliver the queued requests to a later process on that port)."""
        self._lost[rank] = f"{self.role} {rank} at {self.endpoints[rank]} is lost: " + (
            why
            or "its connection dropped (the process exited, or it answered no heartbeat for "
            f"{HEARTBEAT_TIMEOUT_MS / 1000:g} s)"
        )
        log.warning("%s", self._lost[rank])
        self._backlog[rank].clear()
        self._unwatch(rank)
        self.dealers[rank].disable_monitor()
        self._monitors[rank].close(linger=0)
        self.dealers[rank].close(linger=0)
        self._fail_rank(rank, self._lost[rank])

    def _fail_rank(self, rank: int, why: str | None) -> None:
        """Fail every call waiting for server ``rank`` as unavailable, saying ``why``."""
        for call in self._calls.take_rank(rank):
            self._fail(call, why)
