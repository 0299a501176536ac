"""A small key-value store over ZeroMQ, optionally CURVE-secured: the job's meeting points.

Two stores of a job use it: the workers' rendezvous store (worker 0 hosts it at
``SPARSEPS_MASTER``; barriers and gloo's own rendezvous run on it) and the launchers'
control store (``ClusterSpec.control_endpoint``). ``torch.distributed.TCPStore`` did this
before, but it cannot be authenticated and listens on every interface.

- :class:`StoreServer` — one thread with a ROUTER socket bound to ONE address (the job's
  interface; all interfaces only when asked). With a :class:`~sparseps.rpc.security.Security`
  it is a CURVE server behind a ZAP handler that admits only the job's key, so a peer
  without the key cannot send it anything.
- :class:`StoreClient` — a client with torch's ``Store`` methods (set, get, add,
  compare_set, wait, check, delete_key, num_keys), one DEALER socket, no torch import:
  the launcher and ``sparseps scale`` use it (importing torch cost every launch ~2 s of
  CPU and ~3 s of wall before it started any child, on 2 cores). :class:`~sparseps.store.torch_store.ZmqStore`
  is the same client as a ``torch.distributed.Store``, for gloo's rendezvous on the
  workers. Every call is bounded by the store's timeout and raises
  :class:`~sparseps.errors.DeadlineError` naming the op, the address, the seconds and the
  setting that changes them. A lost server or a failed CURVE handshake (wrong or missing
  key) is reported at once as :class:`~sparseps.errors.UnavailableError`, from the socket
  monitor's events, never waited out.

The wire format and the server are in :mod:`sparseps.store.server`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Self, TypeVar

import msgpack
import zmq

from ..errors import DeadlineError, RemoteError, UnavailableError
from .server import (
    MAX_TIMEOUT_MS,
    StoreServer,
    StoreStats,
    new_socket,
    resolve_host,
    tcp_endpoint,
)

__all__ = ["StoreClient", "StoreServer", "StoreStats", "open_store"]

log = logging.getLogger(__name__)

AnyStore = TypeVar("AnyStore", bound="StoreClient")

_WAIT_GRACE_S = 1.0  # a blocked get/wait: the client waits this much past the server's deadline


class StoreClient:
    """A client of a :class:`StoreServer`, with the methods of torch's ``Store``.

    Args:
        address: ``host:port`` of the server.
        timeout_s: the store's timeout: how long every call, and this constructor's first
            contact with the server, may wait.
        setting: the setting that changes ``timeout_s``, named in timeout errors.
        what: what this store is, for messages (``"rendezvous store"``).
        security: a :class:`~sparseps.rpc.security.Security` to be a CURVE client of a
            secure server; None for plain TCP.
        owner: a :class:`StoreServer` this client hosts; closed by :meth:`close`.

    Raises:
        DeadlineError: no server answered at ``address`` within ``timeout_s``.
        UnavailableError: the CURVE handshake failed (wrong or missing job key), or the
            connection was lost.

    Thread-safe: calls are serialised on one socket.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float,
        setting: str,
        what: str = "store",
        security=None,
        owner: StoreServer | None = None,
    ) -> None:
        from ..env import parse_endpoint
        from ..rpc.security import handshake_failed_events

        super().__init__()  # torch's Store, for ZmqStore
        self._seconds = float(timeout_s)
        self.address = address
        self.setting = setting
        self.what = what
        self._security = security
        self._owner = owner
        self._lock = threading.Lock()
        self._next_id = 0
        self._failed_events = handshake_failed_events()
        self._connected = False
        self._broken: UnavailableError | None = None
        host, port = parse_endpoint(address, what=f"{what} address")
        ip = resolve_host(host)
        self._context = zmq.Context()
        self._sock = new_socket(self._context, zmq.DEALER, ip)
        if security is not None:
            security.client_socket(self._sock)
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | self._failed_events
        )
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        # Dropping the last reference closes the store (and the hosted server), as it did
        # for a TCPStore: callers that let go of a store free its port.
        self._finalizer = weakref.finalize(
            self, _release, self._sock, self._monitor, self._context, owner
        )
        self._sock.connect(tcp_endpoint(ip, port))
        try:
            self._call("ping", timeout_s)
        except BaseException:
            self.close()
            raise

    # -- the Store methods -------------------------------------------------------------

    def set(self, key: str, value) -> None:
        self._call("set", self._timeout_s(), key=key, value=_as_bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting for it to be set (up to the store's timeout)."""
        seconds = self._timeout_s()
        return self._blocking("get", seconds, key=key)

    def add(self, key: str, amount: int) -> int:
        return self._call("add", self._timeout_s(), key=key, amount=int(amount))

    def compare_set(self, key: str, expected_value, desired_value) -> bytes:
        return self._call(
            "compare_set",
            self._timeout_s(),
            key=key,
            expected=_as_bytes(expected_value),
            desired=_as_bytes(desired_value),
        )

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Wait until every key in ``keys`` is set (up to ``timeout`` or the store's)."""
        seconds = self._timeout_s() if timeout is None else timeout.total_seconds()
        self._blocking("wait", seconds, keys=list(keys))

    def check(self, keys: list[str]) -> bool:
        return self._call("check", self._timeout_s(), keys=list(keys))

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", self._timeout_s(), key=key)

    def num_keys(self) -> int:
        return self._call("num_keys", self._timeout_s())

    # -- the request loop --------------------------------------------------------------

    def _timeout_s(self) -> float:
        return self._seconds

    def _blocking(self, op: str, seconds: float, **fields):
        # The server holds the request until the keys exist or its deadline passes; we
        # wait a little longer, so a silent server is told apart from missing keys.
        timeout_ms = max(0, min(int(seconds * 1000), MAX_TIMEOUT_MS))
        return self._call(op, seconds + _WAIT_GRACE_S, timeout_ms=timeout_ms, **fields)

    def _call(self, op: str, seconds: float, **fields):
        with self._lock:
            if self._broken is not None:
                raise self._broken
            self._next_id += 1
            rid = self._next_id
            try:
                self._sock.send(msgpack.packb({"op": op, "id": rid, **fields}), zmq.NOBLOCK)
            except zmq.Again:  # the send queue is full: the server has not read in a while
                raise self._timeout(op, seconds, "its queue is full") from None
            except zmq.ZMQError as exc:  # closed, or a message over MAXMSGSIZE
                raise UnavailableError(
                    f"{self.what} {self.address}: cannot send {op} ({exc})",
                    op=op,
                    address=self.address,
                ) from None
            deadline = time.monotonic() + seconds
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout(op, seconds, "no answer")
                ready = dict(self._poller.poll(int(remaining * 1000)))  # ms, as pyzmq rounds
                if self._monitor in ready:
                    self._watch(op)
                if self._sock in ready:
                    reply = self._reply(op)
                    if reply is not None and reply.get("id") == rid:
                        return self._result(op, reply, seconds, fields)

    def _reply(self, op: str) -> dict | None:
        try:
            reply = msgpack.unpackb(self._sock.recv(zmq.NOBLOCK), raw=False)
        except zmq.Again:
            return None
        except Exception as exc:
            log.warning("%s %s: dropped a malformed reply to %s (%s)",
                        self.what, self.address, op, exc)  # fmt: skip
            return None
        return reply if isinstance(reply, dict) else None

    def _result(self, op: str, reply: dict, seconds: float, fields: dict):
        if reply.get("ok") is True:
            return reply.get("value")
        kind, error = reply.get("kind"), str(reply.get("error", ""))
        if kind == "timeout":
            keys = fields.get("keys", [fields.get("key")])
            raise DeadlineError(
                f"{self.what} {self.address}: {op} for key(s) {keys} timed out after "
                f"{seconds - _WAIT_GRACE_S:.1f} s ({error}); check the processes that set "
                f"them, or raise {self.setting}",
                op=op,
                address=self.address,
                seconds=seconds - _WAIT_GRACE_S,
                setting=self.setting,
            )
        raise RemoteError(
            f"{self.what} {self.address}: {op} refused: {error}",
            remote_type="StoreFull" if kind == "full" else "BadRequest",
            remote_traceback="",
            address=self.address,
            op=op,
        )

    def _watch(self, op: str) -> None:
        """Read monitor events; a failed handshake or a lost connection breaks the store."""
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected = True
            elif event & self._failed_events:
                if self._security is None:
                    hint = (
                        "the store is a secure job's (--secure) and this process has no key "
                        "(set SPARSEPS_KEY_DIR to the job's key folder), or it is not a "
                        "sparseps store"
                    )
                else:
                    source = self._security.key_dir or "in memory"
                    hint = (
                        f"CURVE refused this process's key ({source}): it is not the job's "
                        "key, or the store is not secure"
                    )
                self._broken = UnavailableError(
                    f"{self.what} {self.address}: the handshake failed "
                    f"({zmq.Event(event).name}) during {op}; {hint}",
                    op=op,
                    address=self.address,
                )
            elif event == zmq.EVENT_DISCONNECTED and self._connected:
                self._broken = UnavailableError(
                    f"{self.what} {self.address}: lost the connection during {op} (the "
                    "process hosting the store exited or closed it)",
                    op=op,
                    address=self.address,
                )
        if self._broken is not None:
            raise self._broken

    def _timeout(self, op: str, seconds: float, why: str) -> DeadlineError:
        return DeadlineError(
            f"{self.what} {self.address}: {op} got {why} within {seconds:.1f} s; check the "
            f"process hosting the store, or raise {self.setting}",
            op=op,
            address=self.address,
            seconds=seconds,
            setting=self.setting,
        )

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the socket (and the hosted server, if any); later calls raise (idempotent)."""
        with self._lock:
            if self._finalizer.alive:
                self._broken = UnavailableError(
                    f"{self.what} {self.address}: closed", op="close", address=self.address
                )
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r}, secure={self._security is not None})"


def open_store(
    endpoint: str,
    *,
    serve: tuple[str, int] | None,
    timeout_s: float,
    setting: str,
    what: str,
    security=None,
    cannot_listen: Callable[[UnavailableError], Exception],
    no_answer: Callable[[DeadlineError], Exception],
    client: type[AnyStore],
) -> AnyStore:
    """Join the store at ``endpoint``, first hosting it when ``serve`` is ``(host, port)``.

    The one rule for "host a store, join it, and close what we hosted if the join fails"
    (worker rendezvous and the launchers' control store use it).

    Args:
        endpoint: ``host:port`` of the store.
        serve: ``(host, port)`` to listen on (the joined store then owns the server), or
            None to join another process's store.
        timeout_s, setting, what, security: as for :class:`StoreClient`.
        cannot_listen: builds the error raised when the server cannot listen.
        no_answer: builds the error raised when the store did not answer in time.
        client: the client class: :class:`StoreClient`, or
            :class:`~sparseps.store.torch_store.ZmqStore` where gloo takes the store.
    """
    server = None
    if serve is not None:
        try:
            server = StoreServer(*serve, security=security)
        except UnavailableError as exc:
            raise cannot_listen(exc) from None
    try:
        return client(
            endpoint, timeout_s=timeout_s, setting=setting, what=what, security=security,
            owner=server,
        )  # fmt: skip
    except DeadlineError as exc:
        if server is not None:
            server.close()
        raise no_answer(exc) from None
    except BaseException:
        if server is not None:
            server.close()
        raise


def _release(sock: zmq.Socket, monitor: zmq.Socket, context: zmq.Context, owner) -> None:
    """Close a client's sockets and context, then the server it hosts (runs once)."""
    with contextlib.suppress(zmq.ZMQError):
        sock.disable_monitor()
    monitor.close(linger=0)
    sock.close(linger=0)
    context.term()
    if owner is not None:
        owner.close()


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):  # torch passes std::vector<uint8_t> as a list of ints
        return bytes(value)
    raise TypeError(f"store values are bytes or str, got {type(value).__name__}")
