"""The server's request loop: data-plane ops inline, long ops on a pool of threads.

Message flow::

    clients (DEALER) ──tcp──▶ ROUTER front ──▶ loop thread ── data-plane op ──▶ reply
                                                   │
                                                   └─ other ops ──inproc──▶ ROUTER back ──▶ pool threads

Why inline: a pull or push of one batch takes well under a millisecond, and handing it to
another thread costs two inproc messages (each a ``getpid`` + ``write`` syscall in libzmq
and a thread wake-up) plus a GIL hand-off; measured on a 2-core machine, answering pulls
in the loop thread cut the server's CPU per 8192-key pull by about a fifth. A server's data
plane is therefore one thread (the compiled kernels do the work); scale a machine with
more server processes, as with the seed system's pservers.

Long or blocking ops (save, load, shrink, decay, table creation, ...) run on the pool so
the loop keeps answering. While any of them runs, data-plane ops go to the pool as well:
they may wait on a table lock the long op holds, and must not stall the loop (``ping``
and ``stop`` are always answered inline, and the front socket keeps being read while
requests wait for a pool thread, so liveness checks never queue behind a save).

A bad message or a failing handler produces an error reply and one log line; nothing a
peer sends stops the loop except the ``stop`` op.

Metrics (:mod:`sparseps.observe.registry`): :func:`process` observes each request once,
its op's latency and, when it fails, the kind of error; the loop's waiting requests are
the queue depth. Never per key.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..core.closing import Closing
from ..errors import ProtocolError, SparsePSError
from ..observe.registry import server_metrics
from ..rpc import transport
from ..rpc.protocol import (
    OPS,
    Limits,
    decode_request,
    encode_reply,
    peek_request_id,
    read_header,
)
from .handlers import ServerState
from .relay import Relay, Route

if TYPE_CHECKING:
    from .forwarded import ForwardedWrites

__all__ = ["INLINE_OPS", "RequestLoop", "handler_loop"]

log = logging.getLogger(__name__)

# Answered by the loop thread itself (bounded by one batch, no file I/O).
INLINE_OPS = frozenset(
    {
        "pull",
        "push",
        "push_delta",
        "pull_dense",
        "push_dense",
        "push_dense_delta",
        "set_dense",
        "stats",
    }
)
# Answered inline even while a long op runs: they take no table lock (get_placement: a
# client asks it before every table-wide op of a job that may be elastic).
ALWAYS_INLINE_OPS = frozenset({"ping", "stop", "get_placement"})

READY = b"\x00READY"
POLL_MS = 100
# Requests taken from the front socket per wake-up before looking at pool replies again.
_BURST = 32
# Pool-bound requests held while every pool thread is busy (see RequestLoop.waiting).
MAX_WAITING = 4096
MAX_WAITING_BYTES = 256 << 20
# After a stop op, time given to in-flight requests to finish and their replies to leave.
DRAIN_S = 2.0


_incidents = itertools.count(1)


def _error_reply(request_id, exc: BaseException, note: str = "") -> list:
    """An error reply: the exception's type and message, never a traceback (it would show
    a peer our file paths and code; the server's log has it)."""
    error = {"type": type(exc).__name__, "message": f"{exc}{note}", "traceback": ""}
    return encode_reply(request_id, error=error)


def process(
    state: ServerState,
    frames: list,
    limits: Limits,
    peer: str,
    header: dict | None = None,
    identity: bytes | None = None,
) -> list | None:
    """One request in, reply frames out. Never raises. ``header``: the request's header
    as :func:`peek_header` read it (not parsed again), or None. ``identity``: the peer's
    ROUTER identity: a replicated write answered later goes there through the relay
    (:mod:`sparseps.server.relay`), and this returns None.

    Log lines go through the state's :class:`LogBudget`, so a peer sending bad requests
    in a loop costs a few lines a minute, not one per message. The request's latency is
    observed under its op (``invalid`` when it cannot be decoded).
    """
    metrics = server_metrics()
    start = time.perf_counter()
    reply, op, error = _answer(state, frames, limits, peer, header, identity)
    metrics.observe_op(op, time.perf_counter() - start)
    if error:
        metrics.error(error)
    return reply


def _answer(
    state: ServerState,
    frames: list,
    limits: Limits,
    peer: str,
    header: dict | None,
    identity: bytes | None,
) -> tuple[list | None, str, str]:
    """``(reply frames or None when answered later, op, error kind or "")`` of one request."""
    try:
        request = decode_request(frames, limits, header=header)
    except ProtocolError as exc:
        state.count("bad_messages")
        state.log_budget.log(
            logging.WARNING, "bad_message",
            "server %d: bad message from %s dropped with an error reply: %s", state.rank, peer, exc,
        )  # fmt: skip
        return _error_reply(peek_request_id(frames), exc), "invalid", "bad_message"
    try:
        slot = None if request.slot is None else state.replies.slot(*request.slot)
        if slot is not None:  # a same-host client's memory, where the reply's buffers go
            request = dataclasses.replace(request, reply_to=slot)
        route = None if identity is None else Route(identity, request.id)
        answer = state.handle(request, route)
        if answer is None:  # a replicated write: answered once the other copies have it
            return None, request.op, ""
        result, bufs = answer
        detached = request.slot is not None and slot is None  # a segment we do not know
        reply = encode_reply(request.id, result=result, bufs=bufs, slot=slot, detached=detached)
        return reply, request.op, ""
    except ProtocolError as exc:  # refused at the boundary (e.g. another job's request)
        state.count("bad_messages")
        state.log_budget.log(
            logging.WARNING, "refused", "server %d: refused a request from %s: %s",
            state.rank, peer, exc,
        )  # fmt: skip
        return _error_reply(request.id, exc), request.op, "refused"
    except Exception as exc:  # a handler failure is reported to the caller, never fatal here
        state.count("failed")
        if isinstance(exc, SparsePSError):
            state.log_budget.log(
                logging.WARNING, f"failed:{request.op}", "server %d: %s %r failed: %s: %s",
                state.rank, request.op, request.table, type(exc).__name__, exc,
            )  # fmt: skip
            return _error_reply(request.id, exc), request.op, "failed"
        # A bug: the traceback stays in this log, the peer gets an incident number to quote.
        incident = next(_incidents)
        state.log_budget.log(
            logging.ERROR, f"bug:{request.op}", "server %d: %s %r failed (incident %d)",
            state.rank, request.op, request.table, incident, exc_info=exc,
        )  # fmt: skip
        note = f" (server {state.rank} incident {incident}: the traceback is in its log)"
        return _error_reply(request.id, exc, note), request.op, "bug"


def peek_header(frames: list, limits: Limits) -> dict | None:
    """The request's checked header (to route it by its op), or None when it cannot be
    read (the full decode then produces the error reply)."""
    try:
        return read_header(frames, limits)
    except ProtocolError:
        return None


def _nbytes(frames: list) -> int:
    return sum(len(frame) for frame in frames)


def _send_reply(sock: zmq.Socket, frames: list, rank: int, where: str) -> None:
    """Send, logging (never raising) when the transport refuses: the loop must go on."""
    try:
        transport.send_frames(sock, frames)
    except zmq.ContextTerminated:
        raise
    except zmq.ZMQError as exc:
        log.warning("server %d: a reply from the %s could not be sent: %s", rank, where, exc)


def handler_loop(
    context: zmq.Context, address: str, state: ServerState, limits: Limits, done: threading.Event
) -> None:
    """A pool thread: take requests from the loop, answer them the same way."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send(READY)
        while not done.is_set():
            try:
                if not sock.poll(POLL_MS):
                    continue
                frames = transport.recv_frames(sock)
                client, body = frames[0], frames[1:]
                identity = client.bytes
                reply = process(state, body, limits, identity.hex(), identity=identity)
                if reply is None:  # answered later, through the relay: this thread is free
                    sock.send(READY)
                else:
                    _send_reply(sock, [client, *reply], state.rank, "pool")
            except zmq.ContextTerminated:
                raise
            except Exception:  # pragma: no cover - a bug here must not silently shrink the pool
                log.exception("server %d: pool thread error; it keeps serving", state.rank)
    except zmq.ContextTerminated:
        pass
    finally:
        sock.close()


class RequestLoop(Closing):
    """Owns the front socket: answers data-plane ops, routes the rest to the pool.

    Args:
        front: the ROUTER bound to the server's endpoint.
        back: the ROUTER the pool threads connect to.
        state: the server's tables.
        limits: message limits.
        threads: pool size (for the drain at stop).
        relay: replies made on other threads, which the loop sends (replicated jobs).
        forwarded: where writes passed down a shard's chain go (replicated jobs).
    """

    def __init__(
        self,
        front: zmq.Socket,
        back: zmq.Socket,
        state: ServerState,
        limits: Limits,
        threads: int,
        *,
        relay: Relay | None = None,
        forwarded: ForwardedWrites | None = None,
    ) -> None:
        self.front = front
        self.relay = relay
        self.forwarded = forwarded
        self.back = back
        self.state = state
        self.limits = limits
        self.threads = threads
        self.idle: collections.deque[bytes] = collections.deque()
        # Pool-bound requests that found no idle thread. The front keeps being read while
        # they wait (so ping and stop are answered behind a long save), up to
        # MAX_WAITING requests or MAX_WAITING_BYTES; past that it is not read, and zmq's
        # queues (bounded by HWM) hold the rest.
        self.waiting: collections.deque[tuple[list, bool]] = collections.deque()
        self.waiting_bytes = 0
        self.max_waiting_bytes = max(MAX_WAITING_BYTES, limits.max_message_bytes)
        self.long_running = 0
        self._long_by_thread: dict[bytes, bool] = {}
        self._monitor = front.get_monitor_socket(events=zmq.EVENT_DISCONNECTED)

    def close(self) -> None:
        self.front.disable_monitor()
        self._monitor.close(linger=0)

    def run(self) -> None:
        """Serve until a stop op (or signal) and the drain that follows."""
        poller = zmq.Poller()
        poller.register(self.back, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        if self.relay is not None:
            poller.register(self.relay.inbound, zmq.POLLIN)
        drain_until = None
        accepting_before = None
        while True:
            if self.state.stop_requested.is_set():
                drain_until = drain_until or time.monotonic() + DRAIN_S
                # Pool threads announce themselves once; all idle means no reply is pending.
                all_idle = len(self.idle) >= self.threads and not self.waiting
                if all_idle or time.monotonic() > drain_until:
                    return
            accepting = drain_until is None and not self._waiting_full()
            if accepting != accepting_before:
                poller.register(self.front, zmq.POLLIN if accepting else 0)
                accepting_before = accepting
            events = dict(poller.poll(POLL_MS))
            self.state.replies.sweep()
            if self.back in events:
                self._from_pool()
            if self._monitor in events:
                self._log_disconnect()
            if self.relay is not None and self.relay.inbound in events:
                self._relayed()
            if accepting and self.front in events:
                self._take_requests()

    def _take_requests(self) -> None:
        for _ in range(_BURST):
            try:
                frames = transport.recv_frames(self.front, block=False)
            except zmq.Again:
                return
            self._route(frames)
            if self._waiting_full() or self.state.stop_requested.is_set():
                return

    def _relayed(self) -> None:
        """Send the replies other threads made (a burst, then back to the poll)."""
        assert self.relay is not None
        for _ in range(_BURST):
            try:
                frames = transport.recv_frames(self.relay.inbound, block=False)
            except zmq.Again:
                return
            _send_reply(self.front, frames, self.state.rank, "relay")

    def _waiting_full(self) -> bool:
        return len(self.waiting) >= MAX_WAITING or self.waiting_bytes >= self.max_waiting_bytes

    def _route(self, frames: list) -> None:
        client, body = frames[0], frames[1:]
        header = peek_header(body, self.limits)
        op = None if header is None else header.get("op")
        if not isinstance(op, str):
            op = None
        if self.forwarded is not None and header is not None and "forward" in header:
            self.forwarded.put(client.bytes, body, header)  # applied in order, off the loop
            return
        if op in ALWAYS_INLINE_OPS or op not in OPS or (op in INLINE_OPS and not self.long_running):
            identity = client.bytes
            reply = process(self.state, body, self.limits, identity.hex(), header, identity)
            if reply is not None:  # None: a replicated write, answered through the relay
                _send_reply(self.front, [client, *reply], self.state.rank, "loop")
        else:
            self._to_pool(frames, long=op not in INLINE_OPS)

    def _to_pool(self, frames: list, *, long: bool) -> None:
        if not self.idle:
            self.waiting.append((frames, long))
            self.waiting_bytes += _nbytes(frames)
            return
        thread = self.idle.popleft()
        self._long_by_thread[thread] = long
        self.long_running += long
        self.back.send_multipart([thread, *frames], copy=False)

    def _from_pool(self) -> None:
        frames = transport.recv_frames(self.back)
        thread = frames[0].bytes
        if len(frames) > 2 or frames[1].bytes != READY:
            _send_reply(self.front, frames[1:], self.state.rank, "pool")
        self.long_running -= self._long_by_thread.pop(thread, False)
        self.idle.append(thread)
        while self.waiting and self.idle:
            pending, long = self.waiting.popleft()
            self.waiting_bytes -= _nbytes(pending)
            self._to_pool(pending, long=long)

    def _log_disconnect(self) -> None:
        endpoint = recv_monitor_message(self._monitor).get("endpoint", b"")
        # zmq closes a connection that announces a frame over MAXMSGSIZE (before reading
        # it); a client that exits closes it too. Either way it is worth one line.
        log.info(
            "server %d: a client connection closed (the client exited, or it sent a message "
            "over max_message_bytes=%d, which zmq drops with the connection); endpoint %s",
            self.state.rank,
            self.limits.max_message_bytes,
            endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else endpoint,
        )
