"""The server side of the job's key-value store (see :mod:`sparseps.store.client`).

One thread with a ROUTER socket bound to ONE address, answering the requests of
:class:`~sparseps.store.client.StoreClient` clients. The wire format, its bounds and the
request checks live here too: the server is where a message is validated.

Wire format: one msgpack frame each way. A request is a map ``{"op", "id", ...fields}``
(fields per op in ``_FIELDS``); the reply is ``{"id", "ok": True, "value"}`` or
``{"id", "ok": False, "kind", "error"}`` with ``kind`` one of ``bad`` (malformed request),
``full`` (a size bound), ``timeout`` (a ``get``/``wait`` whose keys did not appear in time).
Values are bytes; counters (``add``) are stored as decimal text, as TCPStore does. The
server checks every field and answers a bad request with an error; it never dies of one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import TypeGuard

import msgpack
import zmq

from ..errors import ConfigError, UnavailableError

__all__ = ["StoreServer", "StoreStats", "new_socket", "resolve_host", "tcp_endpoint"]

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20  # one request or reply (zmq MAXMSGSIZE); gloo's values are ~100 B
MAX_STORE_BYTES = 64 << 20  # keys + values held by one server
MAX_KEYS_PER_CALL = 4096
MAX_KEY_CHARS = 1024
MAX_WAITERS = 1024  # blocked get/wait requests held by one server
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
_INT64 = 1 << 63

# Fields of each op, besides "op" and "id"; the server rejects missing and unknown ones.
_FIELDS: dict[str, tuple[str, ...]] = {
    "ping": (),
    "set": ("key", "value"),
    "get": ("key", "timeout_ms"),
    "add": ("key", "amount"),
    "compare_set": ("key", "expected", "desired"),
    "wait": ("keys", "timeout_ms"),
    "check": ("keys",),
    "delete_key": ("key",),
    "num_keys": (),
}


def _is_key(v) -> bool:
    return isinstance(v, str) and len(v) <= MAX_KEY_CHARS


def _is_int(v: object, lo: int, hi: int) -> TypeGuard[int]:
    return type(v) is int and lo <= v < hi


_CHECKS = {
    "key": _is_key,
    "keys": lambda v: isinstance(v, list) and len(v) <= MAX_KEYS_PER_CALL and all(map(_is_key, v)),
    "value": lambda v: isinstance(v, bytes),
    "expected": lambda v: isinstance(v, bytes),
    "desired": lambda v: isinstance(v, bytes),
    "amount": lambda v: _is_int(v, -_INT64, _INT64),
    "timeout_ms": lambda v: _is_int(v, 0, MAX_TIMEOUT_MS + 1),
}


class _BadRequest(Exception):
    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind


def _decode(frames: list[bytes]) -> tuple[int, dict]:
    """Validate one request; returns ``(id, request)`` or raises :class:`_BadRequest`.

    The id comes back even when a later check fails, so the error reply reaches its call.
    """
    if len(frames) != 1:
        raise _BadRequest("bad", f"expected 1 frame, got {len(frames)}")
    try:
        msg = msgpack.unpackb(frames[0], raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types (ExtraData, ValueError, ...)
        raise _BadRequest("bad", f"not msgpack ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise _BadRequest("bad", f"expected a map, got {type(msg).__name__}")
    rid = msg.get("id")
    if not _is_int(rid, 0, _INT64):
        raise _BadRequest("bad", "missing or invalid 'id'")
    op = msg.get("op")
    if op not in _FIELDS:
        raise _BadRequest("bad", f"unknown op {op!r}")
    wanted = {"op", "id", *_FIELDS[op]}
    if set(msg) != wanted:
        raise _BadRequest("bad", f"{op}: expected fields {sorted(wanted)}, got {sorted(msg)}")
    for name in _FIELDS[op]:
        if not _CHECKS[name](msg[name]):
            raise _BadRequest("bad", f"{op}: invalid {name!r}")
    return rid, msg


def resolve_host(host: str) -> str:
    """One IP address for ``host``, IPv4 first (zmq connects IPv4 unless told otherwise)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            return str(socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)[0][4][0])
        except (socket.gaierror, IndexError, UnicodeError):
            continue
    raise ConfigError(f"store address: cannot resolve host {host!r}")


def tcp_endpoint(ip: str, port: int | str) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def new_socket(context: zmq.Context, kind: int, ip: str) -> zmq.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    sock.setsockopt(zmq.IPV6, int(":" in ip))
    return sock


@dataclass(frozen=True)
class StoreStats:
    """What a :class:`StoreServer` holds and has seen."""

    keys: int
    bytes: int
    waiters: int
    requests: int
    bad_requests: int


@dataclass
class _Waiter:
    identity: bytes
    rid: int
    op: str  # "get" (answers the value of keys[0]) or "wait"
    keys: list[str]
    deadline: float


class StoreServer:
    """Serves one key-value store on ``host:port`` from a background thread.

    Args:
        host: the address to listen on (a name is resolved to one address). ``0.0.0.0``
            (every interface) only with ``all_interfaces=True``.
        port: the port; 0 picks a free one (see :attr:`address`).
        security: CURVE + a ZAP handler admitting only the job key; None = plain TCP.
        all_interfaces: allow a wildcard ``host``.
        max_bytes: bound on the keys and values held; a ``set`` past it is refused.

    Raises:
        UnavailableError: cannot listen on ``host:port`` (port in use, foreign address).
        ConfigError: a wildcard host without ``all_interfaces``, or an unknown host.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        security=None,
        all_interfaces: bool = False,
        max_bytes: int = MAX_STORE_BYTES,
    ) -> None:
        if host in ("", "*", "0.0.0.0", "::") and not all_interfaces:
            raise ConfigError(
                f"store: refusing to listen on every interface ({host!r}); give the job's "
                "host address"
            )
        ip = resolve_host(host) if host not in ("", "*") else "0.0.0.0"
        if ipaddress.ip_address(ip).is_loopback and not _is_loopback_name(host):
            log.warning("store: %s resolves to %s, a loopback address: only this host can "
                        "reach it; give an IP address of the job's network", host, ip)  # fmt: skip
        self._max_bytes = max_bytes
        self._data: dict[str, bytes] = {}
        self._bytes = 0
        self._waiters: list[_Waiter] = []
        self._requests = 0
        self._bad = 0
        self._last_bad_log = 0.0
        self._stop = threading.Event()
        self._context = zmq.Context()
        self._auth = None
        try:
            if security is not None:
                self._auth = security.authenticator(self._context)
            self._sock = new_socket(self._context, zmq.ROUTER, ip)
            if security is not None:
                security.server_socket(self._sock)
            self._wake_rx = self._context.socket(zmq.PAIR)
            self._wake_rx.bind(f"inproc://store-wake-{id(self)}")
            self._wake_tx = self._context.socket(zmq.PAIR)
            self._wake_tx.setsockopt(zmq.LINGER, 0)
            self._wake_tx.connect(f"inproc://store-wake-{id(self)}")
            try:
                self._sock.bind(tcp_endpoint(ip, port or "*"))
            except zmq.ZMQError as exc:
                raise UnavailableError(
                    f"store: cannot listen on {host}:{port} ({exc})",
                    op="listen",
                    address=f"{host}:{port}",
                ) from None
        except BaseException:
            self._teardown()
            raise
        bound = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(bound.rsplit(":", 1)[1])
        self.host = host
        self.address = f"{host}:{self.port}"
        self.secure = security is not None
        self._thread = threading.Thread(
            target=self._run, name=f"sparseps-store-{self.port}", daemon=True
        )
        self._thread.start()

    # -- the server thread -------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                timeout_ms = 1000
                if self._waiters:
                    first = min(w.deadline for w in self._waiters)
                    timeout_ms = max(0, min(timeout_ms, int((first - time.monotonic()) * 1000) + 1))
                ready = dict(poller.poll(timeout_ms))
                if self._sock in ready:
                    for _ in range(100):  # a batch, then look at deadlines and the stop flag
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(frames[0], frames[1:])
                self._expire()
        except zmq.ContextTerminated:  # pragma: no cover - close() stops us first
            pass
        except Exception:  # pragma: no cover - a bug here must be visible, not a silent hang
            log.exception("store %s: server thread failed", self.address)

    def _reply(self, identity: bytes, rid: int | None, value=None, *, kind: str = "", error=""):
        body = {"id": rid, "ok": True, "value": value} if not kind else {
            "id": rid, "ok": False, "kind": kind, "error": error}  # fmt: skip
        # A peer that is gone or whose queue is full loses its reply; the server goes on.
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send_multipart([identity, msgpack.packb(body)], zmq.NOBLOCK)

    def _handle(self, identity: bytes, frames: list[bytes]) -> None:
        self._requests += 1
        rid = None
        try:
            rid, msg = _decode(frames)
            value = self._apply(identity, rid, msg)
        except _BadRequest as exc:
            if exc.kind == "bad":
                self._bad += 1
                now = time.monotonic()
                if now - self._last_bad_log > 1.0:  # a flood of bad requests is one line a second
                    self._last_bad_log = now
                    log.warning("store %s: bad request (%s); %d so far",
                                self.address, exc, self._bad)  # fmt: skip
            self._reply(identity, rid, kind=exc.kind, error=str(exc))
            return
        if value is not _PENDING:
            self._reply(identity, rid, value)

    def _apply(self, identity: bytes, rid: int, msg: dict):
        op = msg["op"]
        data = self._data
        if op == "ping":
            return None
        if op == "set":
            self._put(msg["key"], msg["value"])
            return None
        if op == "add":
            key = msg["key"]
            try:
                current = int(data.get(key, b"0"))
            except ValueError:
                raise _BadRequest("bad", f"add: key {key!r} does not hold an integer") from None
            total = current + msg["amount"]
            if not -_INT64 <= total < _INT64:
                raise _BadRequest("bad", f"add: key {key!r} would overflow int64")
            self._put(key, str(total).encode())
            return total
        if op == "compare_set":
            key, expected, desired = msg["key"], msg["expected"], msg["desired"]
            held = data.get(key)
            if (held is None and expected == b"") or held == expected:
                self._put(key, desired)
                return desired
            return expected if held is None else held
        if op == "check":
            return all(k in data for k in msg["keys"])
        if op == "delete_key":
            value = data.pop(msg["key"], None)
            if value is not None:
                self._bytes -= len(msg["key"]) + len(value)
            return value is not None
        if op == "num_keys":
            return len(data)
        keys = [msg["key"]] if op == "get" else msg["keys"]  # get / wait: block until present
        if all(k in data for k in keys):
            return data[keys[0]] if op == "get" else None
        if len(self._waiters) >= MAX_WAITERS:
            raise _BadRequest("full", f"{len(self._waiters)} calls already wait on this store")
        deadline = time.monotonic() + msg["timeout_ms"] / 1000
        self._waiters.append(_Waiter(identity, rid, op, keys, deadline))
        return _PENDING

    def _put(self, key: str, value: bytes) -> None:
        old = self._data.get(key)
        grown = len(value) - (len(old) if old is not None else -len(key))
        if self._bytes + grown > self._max_bytes:
            raise _BadRequest(
                "full", f"the store holds {self._bytes} bytes; {grown} more would pass its "
                f"bound of {self._max_bytes}")  # fmt: skip
        self._data[key] = value
        self._bytes += grown
        if self._waiters:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        data = self._data
        ready: list[_Waiter] = []
        still: list[_Waiter] = []
        for w in self._waiters:
            (ready if all(k in data for k in w.keys) else still).append(w)
        self._waiters = still
        for w in ready:
            self._reply(w.identity, w.rid, data[w.keys[0]] if w.op == "get" else None)

    def _expire(self) -> None:
        now = time.monotonic()
        done = [w for w in self._waiters if w.deadline <= now]
        if done:
            self._waiters = [w for w in self._waiters if w.deadline > now]
        for w in done:
            missing = [k for k in w.keys if k not in self._data]
            self._reply(w.identity, w.rid, kind="timeout", error=f"missing key(s) {missing}")

    # -- lifecycle ---------------------------------------------------------------------

    def stats(self) -> StoreStats:
        """A snapshot (read without a lock: the numbers may be one request apart)."""
        return StoreStats(
            keys=len(self._data),
            bytes=self._bytes,
            waiters=len(self._waiters),
            requests=self._requests,
            bad_requests=self._bad,
        )

    def close(self) -> None:
        """Stop serving (idempotent). Blocked clients see the connection drop."""
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(zmq.ZMQError):
            self._wake_tx.send(b"", zmq.NOBLOCK)
        self._thread.join(timeout=5.0)
        self._teardown()

    def _teardown(self) -> None:
        for name in ("_sock", "_wake_rx", "_wake_tx"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(linger=0)
        if self._auth is not None:
            self._auth.close()
        self._context.term()

    def __enter__(self) -> StoreServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreServer({self.address!r}, secure={self.secure})"


_PENDING = object()


def _is_loopback_name(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
