"""The server process: a ROUTER front socket, a pool of handler threads, and a stop op.

Message flow (the "least-recently-used broker" pattern)::

    clients (DEALER) ──tcp──▶ ROUTER front ──▶ broker loop ──inproc──▶ ROUTER back ──▶ handler threads
                                                 (this thread)                  (DEALER each)

The broker only moves frames (zero-copy): it hands each request to an *idle* handler
thread, so a slow request (a save) never queues others behind it while threads are free.
Handler threads decode and validate the request (:func:`decode_request`), run it on
:class:`~sparseps.server.handlers.ServerState` and send the reply back the same way.

A bad message or a failing handler produces an error reply and one log line; nothing a
peer sends can stop the server except the ``stop`` op (or SIGTERM / SIGINT when
:func:`serve` runs in the main thread).
"""

from __future__ import annotations

import collections
import itertools
import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence

import zmq

from ..env import Role, RoleEnv, parse_endpoint
from ..errors import ConfigError, ProtocolError, SparsePSError, UnavailableError
from ..rpc import transport
from ..rpc.protocol import Limits, decode_request, encode_reply, peek_request_id
from .handlers import ServerState

__all__ = ["DEFAULT_THREADS", "run_from_env", "serve"]

log = logging.getLogger(__name__)

DEFAULT_THREADS = 4
_READY = b"\x00READY"
_POLL_MS = 100
# After a stop op, time given to in-flight requests to finish and their replies to leave.
_DRAIN_S = 2.0
_instance = itertools.count()


def _error_reply(request_id, exc: BaseException, *, with_traceback: bool) -> list:
    text = "".join(traceback.format_exception(exc)) if with_traceback else ""
    return encode_reply(
        request_id, error={"type": type(exc).__name__, "message": str(exc), "traceback": text}
    )


def _process(state: ServerState, frames: list, limits: Limits, peer: str) -> list:
    """One request in, reply frames out. Never raises."""
    try:
        request = decode_request(frames, limits)
    except ProtocolError as exc:
        state.count("bad_messages")
        log.warning(
            "server %d: bad message from %s dropped with an error reply: %s", state.rank, peer, exc
        )
        return _error_reply(peek_request_id(frames), exc, with_traceback=False)
    try:
        result, bufs = state.handle(request)
        return encode_reply(request.id, result=result, bufs=bufs)
    except Exception as exc:  # a handler failure is reported to the caller, never fatal here
        state.count("failed")
        log.warning(
            "server %d: %s %r failed: %s: %s",
            state.rank,
            request.op,
            request.table,
            type(exc).__name__,
            exc,
        )
        return _error_reply(request.id, exc, with_traceback=not isinstance(exc, SparsePSError))


def _handler_loop(
    context: zmq.Context, address: str, state: ServerState, limits: Limits, done: threading.Event
) -> None:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send(_READY)
        while not done.is_set():
            if not sock.poll(_POLL_MS):
                continue
            frames = sock.recv_multipart(copy=False)
            client, body = frames[0], frames[1:]
            reply = _process(state, body, limits, peer=client.bytes.hex())
            transport.send_frames(sock, [client, *reply])
    except zmq.ContextTerminated:
        pass
    finally:
        sock.close()


def _check_args(rank: int, endpoints: Sequence[str], threads: int) -> None:
    if not endpoints:
        raise ConfigError("serve: endpoints must list at least one host:port")
    for i, endpoint in enumerate(endpoints):
        parse_endpoint(endpoint, what=f"endpoints[{i}]")
    if not isinstance(rank, int) or not 0 <= rank < len(endpoints):
        raise ConfigError(f"serve: rank {rank!r} out of range 0..{len(endpoints) - 1}")
    if not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"serve: threads must be an int >= 1, got {threads!r}")


def serve(
    rank: int,
    endpoints: Sequence[str],
    *,
    bind_host: str | None = None,
    threads: int = DEFAULT_THREADS,
    limits: Limits | None = None,
    ready: threading.Event | None = None,
) -> None:
    """Serve shard ``rank`` of ``len(endpoints)`` of every table until stopped.

    Blocks until a ``stop`` op arrives, or SIGTERM/SIGINT when called from the main thread.
    Logs ``running server with rank id: R, endpoint: HOST:PORT`` once bound.

    Args:
        rank: this server's index in ``endpoints``.
        endpoints: ``host:port`` of every server, in rank order (the same list the workers use).
        bind_host: interface to bind; default: the endpoint's host if it is an IP address
            (``localhost`` -> 127.0.0.1), else all interfaces.
        threads: handler threads.
        limits: message size limits (default :class:`Limits`).
        ready: set once the socket is bound (for in-process servers).

    Raises:
        ConfigError: bad rank, endpoints or threads.
        UnavailableError: the port cannot be bound (in use, or not an address of this host).
    """
    _check_args(rank, endpoints, threads)
    limits = limits or Limits()
    endpoint = endpoints[rank]
    state = ServerState(rank, len(endpoints), endpoint)
    context = transport.new_context()
    front = transport.new_router(context, limits.max_message_bytes)
    back = context.socket(zmq.ROUTER)
    back.setsockopt(zmq.LINGER, 0)
    address = transport.bind_address(endpoint, bind_host)
    try:
        front.bind(address)
    except zmq.ZMQError as exc:
        front.close()
        back.close()
        context.term()
        raise UnavailableError(
            f"server {rank}: cannot bind {address} ({exc}); is another process using port "
            f"{parse_endpoint(endpoint)[1]}, or is the host not an address of this machine?",
            op="bind",
            role="server",
            rank=rank,
            address=endpoint,
        ) from None
    inproc = f"inproc://sparseps-server-{rank}-{next(_instance)}"
    back.bind(inproc)
    done = threading.Event()
    workers = [
        threading.Thread(
            target=_handler_loop,
            args=(context, inproc, state, limits, done),
            name=f"sparseps-server-{rank}-h{i}",
            daemon=True,
        )
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    previous = (
        _install_signals(state) if threading.current_thread() is threading.main_thread() else {}
    )
    host, port = parse_endpoint(endpoint)
    log.info("running server with rank id: %d, endpoint: %s:%d", rank, host, port)
    if ready is not None:
        ready.set()
    try:
        _broker(front, back, state, threads)
    finally:
        done.set()
        for worker in workers:
            worker.join(timeout=2.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        front.close()
        back.close()
        busy = [w.name for w in workers if w.is_alive()]
        if busy:
            # context.term() would wait for their sockets forever; the daemon threads end
            # with the process.
            log.warning("server %d: handler threads still busy at stop: %s", rank, ", ".join(busy))
        else:
            context.term()
        log.info("server %d stopped", rank)


def _broker(front: zmq.Socket, back: zmq.Socket, state: ServerState, threads: int) -> None:
    """Move requests to idle handlers and replies to clients until stopped and drained."""
    idle: collections.deque[bytes] = collections.deque()
    poller = zmq.Poller()
    poller.register(back, zmq.POLLIN)
    drain_until = None
    while True:
        if state.stop_requested.is_set():
            drain_until = drain_until or time.monotonic() + _DRAIN_S
            # Ready handlers announce themselves once; all idle means no reply is pending.
            if len(idle) >= threads or time.monotonic() > drain_until:
                return
        accepting = bool(idle) and drain_until is None
        poller.register(front, zmq.POLLIN if accepting else 0)
        events = dict(poller.poll(_POLL_MS))
        if back in events:
            frames = back.recv_multipart(copy=False)
            idle.append(frames[0].bytes)
            if len(frames) > 2 or frames[1].bytes != _READY:
                front.send_multipart(frames[1:], copy=False)
        if accepting and front in events:
            frames = front.recv_multipart(copy=False)
            back.send_multipart([idle.popleft(), *frames], copy=False)


def _install_signals(state: ServerState) -> dict:
    def _stop(signum, _frame):
        log.info("server %d: signal %d, stopping", state.rank, signum)
        state.stop_requested.set()

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, _stop)
    return previous


def _ensure_logging() -> None:
    """Make the start line reach stderr when the host process configured no logging."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)


def run_from_env(role_env: RoleEnv, **options) -> None:
    """Serve as described by the launcher's environment (DESIGN §2.2).

    Args:
        role_env: from :func:`sparseps.env.from_environ`; its role must be ``server``.
        **options: passed on to :func:`serve` (``bind_host``, ``threads``, ``limits``).

    Raises:
        ConfigError: the environment does not describe a server.
    """
    if role_env is None or role_env.role is not Role.SERVER:
        found = (
            "no SPARSEPS_* environment (local mode)"
            if role_env is None
            else f"role {role_env.role.value!r}"
        )
        raise ConfigError(f"run_from_env: SPARSEPS_ROLE must be 'server', got {found}")
    _ensure_logging()
    serve(role_env.rank, list(role_env.servers), **options)
