"""The server process: bind the endpoint, run the request loop, stop cleanly.

:class:`~sparseps.server.loop.RequestLoop` owns the front socket and answers data-plane
ops itself; long ops go to a small pool of threads (see that module for why). This module
sets the sockets up, installs the signal handlers and tears everything down.

Nothing a peer sends can stop the server except the ``stop`` op (or SIGTERM / SIGINT when
:func:`serve` runs in the main thread).
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import zmq

from ..core.jit import load_cached_kernels
from ..env import (
    Role,
    RoleEnv,
    disk_dir_setting,
    file_roots_setting,
    parse_endpoint,
    recover_setting,
    replicas_setting,
)
from ..errors import ConfigError, UnavailableError
from ..observe.registry import watch_server
from ..rpc import transport
from ..rpc.channel import Channel
from ..rpc.protocol import Limits, Request
from ..rpc.security import Security, security_from_key_dir
from .forwarded import ForwardedWrites
from .handlers import ServerState
from .loop import RequestLoop, handler_loop, process
from .recovery import RECOVER_TIMEOUT_S, recover
from .relay import Relay
from .reply_segments import remove_orphans

__all__ = ["DEFAULT_THREADS", "run_from_env", "serve"]

log = logging.getLogger(__name__)

# Pool threads for long ops (save, load, shrink, ...); the data plane runs in the loop.
DEFAULT_THREADS = max(1, min(4, os.cpu_count() or 1))
_instance = itertools.count()
# Writes a server may have passed down its shards' chains and not yet had acknowledged.
PEER_IN_FLIGHT = 1 << 16


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
    security: Security | None = None,
    job_id: str | None = None,
    file_roots: Sequence[str] | None = None,
    disk_dir: str | None = None,
    replicas: int = 0,
    recover: bool = False,
) -> None:
    """Serve shard ``rank`` of ``len(endpoints)`` of every table until stopped.

    Blocks until a ``stop`` op arrives, or SIGTERM/SIGINT when called from the main thread.
    Logs ``running server with rank id: R, endpoint: HOST:PORT`` once bound.

    Args:
        rank: this server's index in ``endpoints``.
        endpoints: ``host:port`` of every server, in rank order (the same list the workers use).
        bind_host: interface to bind; default: the endpoint's host if it is an IP address
            (``localhost`` -> 127.0.0.1), else all interfaces.
        threads: pool threads for long ops (default: the core count, at most 4).
        limits: message size limits (default :class:`Limits`).
        ready: set once the socket is bound (for in-process servers).
        security: the job's CURVE keys: only peers holding them get past the handshake,
            and nothing an unauthenticated peer sends is buffered (None: plain transport).
        job_id: the job this server belongs to: requests of any other job are refused
            (None accepts any; the launcher always sets it).
        file_roots: folders save/load may use (:mod:`sparseps.server.file_guard`); None
            accepts any absolute path.
        disk_dir: the folder for tables' rows beyond their ``memory_rows`` (the server
            takes ``disk_dir/server-RANK``; :mod:`sparseps.server.disk_dir`); None refuses
            tables with ``memory_rows``.
        replicas: backup copies per shard (the job's ``--replicas``): this server also
            holds the ``replicas`` shards before its own (:mod:`sparseps.core.replicas`).
        recover: this server replaces a lost one: it copies every shard it holds from a
            surviving copy while serving (:mod:`sparseps.server.recovery`), and raises
            when some shard has no surviving copy.

    Raises:
        ConfigError: bad rank, endpoints, threads or replicas.
        UnavailableError: the port cannot be bound (in use, or not an address of this host).
    """
    _check_args(rank, endpoints, threads)
    # Before the port is bound, so that no request waits for it: a server started as a
    # fresh interpreter (Ray, Kubernetes, no fork server) would otherwise load each kernel
    # on its first call, and its first pull and push took 0.3-1.7 s each on a loaded
    # 2-core box (measured); a server added by a scale met them right at the cut-over,
    # with every sync worker waiting. A forked server has them already (3 ms).
    start = time.perf_counter()
    if loaded := load_cached_kernels():
        log.info("server %d: %d cached kernels loaded in %.2f s", rank, loaded,
                 time.perf_counter() - start)  # fmt: skip
    limits = limits or Limits()
    endpoint = endpoints[rank]
    state = ServerState(
        rank, len(endpoints), endpoint, job_id=job_id, file_roots=file_roots,
        disk_dir=disk_dir, replicas=replicas, recovering=recover,
    )  # fmt: skip
    remove_orphans()  # reply segments of servers killed on this host (reply_segments)
    context = transport.new_context()
    # libzmq asks the ZAP handler about every peer; it must run before the socket binds.
    auth = security.authenticator(context) if security is not None else None
    front = transport.new_router(context, limits.max_message_bytes, security=security)
    back = context.socket(zmq.ROUTER)
    back.setsockopt(zmq.LINGER, 0)
    address = transport.bind_address(endpoint, bind_host)
    try:
        front.bind(address)
    except zmq.ZMQError as exc:
        state.close()
        front.close()
        back.close()
        if auth is not None:
            auth.close()
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
            target=handler_loop,
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
    if state.backups:
        log.info(
            "server %d: primary of shard %d, backup of shard(s) %s (replicas=%d)",
            rank, rank, ", ".join(map(str, state.backups)), replicas,
        )  # fmt: skip
    if security is not None:
        log.info("server %d: CURVE transport, job keys from %s", rank, security.key_dir or "memory")
    if ready is not None:
        ready.set()
    relay = forwarded = peers = None
    if replicas:  # the shard chains: writes pass from copy to copy over the peers channel
        relay = Relay(context, rank)
        peers = _peers(endpoints, limits, security, job_id)
        state.attach_chain(peers, relay)
        forwarded = ForwardedWrites(state, limits, relay, process)
    loop = RequestLoop(front, back, state, limits, threads, relay=relay, forwarded=forwarded)
    failures: list[BaseException] = []
    if recover:
        assert peers is not None, "a replacement server has replicas"
        copier = threading.Thread(
            target=_recover, name=f"sparseps-server-{rank}-recover", daemon=True,
            args=(state, peers, file_roots, failures),
        )  # fmt: skip
        copier.start()
    # /metrics (when the process serves it) reads table sizes from the stats op
    stats_request = Request(op="stats", id=0, table=None, bufs={}, args={}, job=job_id)
    watch_server(lambda: _stats(state, stats_request), lambda: len(loop.waiting))
    try:
        loop.run()
    finally:
        loop.close()
        done.set()
        for worker in workers:
            worker.join(timeout=2.0)
        if forwarded is not None:
            forwarded.stop()
        if peers is not None:
            state.stop_chains()
            peers.close()
        if relay is not None:
            relay.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        front.close()
        back.close()
        if auth is not None:
            auth.close()
        busy = [w.name for w in workers if w.is_alive()]
        if busy:
            # context.term() would wait for their sockets forever; the daemon threads end
            # with the process.
            log.warning("server %d: handler threads still busy at stop: %s", rank, ", ".join(busy))
        else:
            context.term()
            state.close()  # no handler runs any more: the disk files can go
        log.info("server %d stopped", rank)
    if failures:
        raise failures[0]


def _peers(
    endpoints: Sequence[str], limits: Limits, security: Security | None, job_id: str | None
) -> Channel:
    """The server's channel to the other servers (a replicated job): writes passed down
    the shards' chains, a replacement's copies, and the loss of a peer (its connection
    dropped) for the copies to act on."""
    return Channel(
        endpoints, timeout=RECOVER_TIMEOUT_S, timeout_setting="the servers' chain timeout",
        max_in_flight=PEER_IN_FLIGHT, limits=limits, security=security, job_id=job_id,
        detect_loss=True,
    )  # fmt: skip


def _recover(state: ServerState, peers: Channel, file_roots, failures: list) -> None:
    """The replacement's copy of its shards; a failure stops the server (and is raised)."""
    log.info(
        "server %d: replacement server; copying shard(s) %s from the surviving copies",
        state.rank, ", ".join(map(str, [state.rank, *state.backups])),
    )  # fmt: skip
    try:
        recover(state, peers, directory=file_roots[0] if file_roots else None)
    except BaseException as exc:  # the server must not serve a shard it does not hold
        log.error("server %d: %s", state.rank, exc)
        failures.append(exc)
        state.stop_requested.set()


def _stats(state: ServerState, request: Request) -> dict:
    answer = state.handle(request)
    assert answer is not None, "without a route an answer is given at once"
    result = answer[0]
    assert isinstance(result, dict), "the stats op answers a dict"
    return result


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


def run_from_env(role_env: RoleEnv, **options: Any) -> None:
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
    if "security" not in options:
        options["security"] = security_from_key_dir(role_env.key_dir)
    options.setdefault("file_roots", file_roots_setting())
    options.setdefault("disk_dir", disk_dir_setting())
    options.setdefault("replicas", replicas_setting())
    options.setdefault("recover", recover_setting())
    serve(role_env.rank, list(role_env.servers), job_id=role_env.job_id, **options)
