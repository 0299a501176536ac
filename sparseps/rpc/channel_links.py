"""A :class:`~sparseps.rpc.channel.Channel`'s connections to its servers, over their life.

One DEALER socket per server rank, and its monitor socket: connecting (and the heartbeats
of a replicated job), the monitor's events (connected, handshake failed, connection lost),
why a server refused the handshake, a server lost (its calls fail at once, its socket is
closed so nothing queued for it reaches a later process on the same port), reconnecting to
a replacement (:meth:`ServerLinks.revive`) and connecting to an elastic job's new servers
(:meth:`ServerLinks.grow`). The sockets change only on the channel's I/O thread, holding
the socket lock (``_io``); callers queue what they want done and wait for it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import zmq

from ..errors import DeadlineError, UnavailableError
from . import transport
from .security import handshake_failed_events

if TYPE_CHECKING:
    from .call import Call
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
    """The connection half of :class:`Channel` (a mixin: the state is the channel's)."""

    if TYPE_CHECKING:  # what it uses of Channel
        endpoints: tuple[str, ...]
        role: str
        limits: Limits
        security: Security | None
        detect_loss: bool
        _context: zmq.Context
        _io: threading.Lock
        _lock: threading.Lock
        _pending: dict[int, Call]
        _slots: threading.BoundedSemaphore
        _dealers: list[zmq.Socket]
        _monitors: list[zmq.Socket]
        _poller: zmq.Poller
        _rank_of: dict[int, int]
        _monitor_of: dict[zmq.Socket, int]
        _fds_version: int
        _lost: list[str | None]
        _refused: list[str | None]
        _was_connected: list[bool]
        _why_lost: list[str]
        _state: list[str]
        _backlog: list[collections.deque]
        _revive: collections.deque[tuple[int, threading.Event]]
        _growth: collections.deque[tuple[list[str], threading.Event]]
        _grow_lock: threading.Lock

        def _settle(self, call: Call) -> None: ...

        def nudge(self) -> None: ...

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

    def revive(self, rank: int, timeout: float = 10.0) -> None:
        """Connect again to a lost server ``rank`` (a replacement now serves there).

        Raises:
            DeadlineError: the I/O thread did not get to it within ``timeout``.
        """
        if self._lost[rank] is None:
            return
        done = threading.Event()
        self._revive.append((rank, done))
        self.nudge()
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
                self.nudge()
                if not done.wait(timeout):
                    raise DeadlineError(
                        f"connecting to new {self.role}s {new} took over {timeout:g} s",
                        op="grow", role=self.role, address=new[0], seconds=timeout,
                        setting="Channel.grow(timeout=...)",
                    )  # fmt: skip
            index = {e: i for i, e in enumerate(self.endpoints)}
        return [index[e] for e in endpoints]

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
                self._dealers.append(dealer)
                self._monitors.append(monitor)
                self._watch(rank)
                log.info("%s %d at %s: connecting (a new server of the job)", self.role, rank,
                         endpoint)  # fmt: skip
            done.set()

    def mark_lost(self, rank: int, why: str, timeout: float = 10.0) -> None:
        """Treat server ``rank`` as lost (it does not answer: a port nobody serves any
        more); done by the I/O thread, which this waits for (at most ``timeout`` s)."""
        if self._lost[rank] is None:
            done = threading.Event()
            self._why_lost[rank] = why
            self._revive.append((-1 - rank, done))
            self.nudge()
            done.wait(timeout)

    def _serve_revivals(self) -> None:
        while self._revive:
            rank, done = self._revive.popleft()
            if rank < 0:  # mark_lost
                if self._lost[-1 - rank] is None:
                    self._lose(-1 - rank, self._why_lost[-1 - rank])
            elif self._lost[rank] is not None:
                dealer, monitor = self._connect(rank)
                self._dealers[rank], self._monitors[rank] = dealer, monitor
                self._watch(rank)
                self._was_connected[rank] = False
                self._state[rank] = "connecting"
                self._lost[rank] = None
                log.info("server %d at %s: connecting again", rank, self.endpoints[rank])
            done.set()

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

    def _watch(self, rank: int) -> None:
        """Watch server ``rank``: its monitor here, its DEALER's descriptor for the waiting
        threads that read replies (I/O thread, socket lock held)."""
        self._rank_of[self._descriptor(rank)] = rank
        self._fds_version += 1
        self._monitor_of[self._monitors[rank]] = rank
        self._poller.register(self._monitors[rank], zmq.POLLIN)

    def _unwatch(self, rank: int) -> None:
        """Stop watching server ``rank`` (before its sockets are closed)."""
        self._rank_of.pop(self._descriptor(rank), None)
        self._fds_version += 1
        self._monitor_of.pop(self._monitors[rank], None)
        self._poller.unregister(self._monitors[rank])

    def _descriptor(self, rank: int) -> int:
        return cast(int, self._dealers[rank].getsockopt(zmq.FD))

    def _on_event(self, rank: int, event: dict) -> None:
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
        self._dealers[rank].disable_monitor()
        self._monitors[rank].close(linger=0)
        self._dealers[rank].close(linger=0)
        self._fail_rank(rank, self._lost[rank])

    def _fail_rank(self, rank: int, why: str | None) -> None:
        """Fail every call waiting for server ``rank`` as unavailable, saying ``why``."""
        with self._lock:
            failed = [c for c in self._pending.values() if c.rank == rank]
            for call in failed:
                del self._pending[call.id]
        for call in failed:
            self._fail_unavailable(call, why)

    def _fail_if_pending(self, call: Call, why: str | None) -> None:
        """Fail ``call`` as unavailable unless it was answered or given up already."""
        with self._lock:
            waiting = self._pending.pop(call.id, None)
        if waiting is not None:
            self._fail_unavailable(call, why)

    def _fail_unavailable(self, call: Call, why: str | None) -> None:
        """(``call`` taken out of the pending ones by the caller.)"""
        self._slots.release()
        call.failure = UnavailableError(
            f"{call.op}: {why}",
            op=call.op, role=self.role, rank=call.rank, address=self.endpoints[call.rank],
        )  # fmt: skip
        self._settle(call)
