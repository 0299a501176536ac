"""zmq plumbing shared by the client and the server: sockets, addresses, zero-copy sends.

Nothing here knows about ops or tables; it only creates sockets with the options the
protocol relies on and moves frames.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import socket
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import zmq

from ..env import parse_endpoint
from . import port_claims
from .security import Security

__all__ = [
    "LISTEN_PORTS_FROM",
    "bind_address",
    "connect_address",
    "free_port",
    "free_ports",
    "new_context",
    "new_dealer",
    "new_router",
    "recv_frames",
    "send_frames",
]

_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)

# A reply queued to a departed client must not keep a closing socket alive forever.
LINGER_MS = 1000
# Messages queued per peer before a send would block (each is one request or reply).
HWM = 10_000


def new_context() -> zmq.Context:
    """A private zmq context (never the global instance: no hidden singletons)."""
    return zmq.Context(io_threads=1)


def connect_address(endpoint: str) -> str:
    """``host:port`` -> ``tcp://host:port`` for connect (hostnames are resolved by zmq)."""
    host, port = parse_endpoint(endpoint)
    return f"tcp://{host}:{port}"


def bind_address(endpoint: str, bind_host: str | None = None) -> str:
    """The address a server binds for ``endpoint``.

    Without ``bind_host``: an IP literal or ``localhost`` in the endpoint is bound as is;
    a host name is bound on all interfaces (``0.0.0.0``), since zmq can only bind
    interface addresses.
    """
    host, port = parse_endpoint(endpoint)
    if bind_host is None:
        if host == "localhost":
            bind_host = "127.0.0.1"
        else:
            try:
                ipaddress.ip_address(host)
                bind_host = host
            except ValueError:
                bind_host = "0.0.0.0"
    return f"tcp://{bind_host}:{port}"


# Listening ports are picked from here up to the kernel's ephemeral range (see free_ports);
# below 20000 is Ray's default range for its worker processes (10002-19999), and a Ray
# node refuses a component port in it.
LISTEN_PORTS_FROM = 20_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES_PER_PORT = 64


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (see :func:`free_ports`)."""
    return free_ports(host, 1)[0]


def free_ports(host: str, count: int, *, draw: random.Random | None = None) -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now, for servers to bind later.

    Why not the kernel's choice (``bind(host, 0)``): it comes from the ephemeral range,
    the ports every outgoing connection of every process on the machine takes its local
    port from, so in the second or two before a server process binds its port, any new
    connection (a test's client, a gloo mesh) could take it. These ports are drawn at
    random below that range, where only another listener can take one; where the range
    cannot be read (not Linux) or leaves no room below it, the kernel chooses. A drawn
    port is also claimed for this process (:mod:`.port_claims`), so that no other process
    of this user hands it out while its server is starting. The ports are closed before
    returning: a listener outside sparseps could still take one first.

    ``draw`` picks the candidates (default: the OS's randomness; tests pass their own).

    Raises:
        OSError: ``host`` is not an address of this machine (or no port could be bound).
    """
    span = _listen_span()
    draw = draw if draw is not None else random.SystemRandom()
    sockets: list[socket.socket] = []
    tries = 0
    try:
        while len(sockets) < count:
            port = 0 if span is None or tries >= _TRIES_PER_PORT * count else draw.randrange(*span)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError as exc:
                sock.close()
                if port == 0 or exc.errno != errno.EADDRINUSE:
                    raise
                tries += 1
                continue
            if port and not port_claims.claims.claim(port):  # another launcher's, starting
                sock.close()
                tries += 1
                continue
            sockets.append(sock)  # held until all are bound, so the ports differ
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _listen_span() -> tuple[int, int] | None:
    """``[low, high)`` of the ports below the ephemeral range, None if there are few."""
    try:
        first = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (LISTEN_PORTS_FROM, first) if first - LISTEN_PORTS_FROM >= 1000 else None


def new_router(
    context: zmq.Context, max_message_bytes: int, *, security: Security | None = None
) -> zmq.Socket:
    """The server's front socket.

    ``MAXMSGSIZE`` makes zmq drop a peer that announces a frame larger than the limit
    before any memory is allocated for it, so a hostile size cannot balloon the server.
    With ``security`` the socket is a CURVE server: start ``security.authenticator`` on
    ``context`` first; zmq then accepts no message from a peer before its key is admitted.
    """
    sock = context.socket(zmq.ROUTER)
    if security is not None:
        security.server_socket(sock)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    # A reply to a client that disconnected is dropped instead of raising.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    return sock


def new_dealer(
    context: zmq.Context, max_message_bytes: int, *, security: Security | None = None
) -> zmq.Socket:
    """A client's socket to one server (requests out, replies in, matched by id).

    With ``security`` the socket is a CURVE client holding the job's key pair.
    """
    sock = context.socket(zmq.DEALER)
    if security is not None:
        security.client_socket(sock)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    return sock


def send_frames(sock: zmq.Socket, frames: Sequence, *, flags: int = 0) -> None:
    """Send a multipart message; numpy buffers go zero-copy.

    zmq keeps a reference to each buffer until the kernel has taken the bytes, so the
    caller must not modify an array after handing it here.
    """
    flags = int(flags)  # plain ints: combining pyzmq's enum flags costs more than a send
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        part_flags = flags | _SNDMORE if i < last else flags
        if isinstance(frame, np.ndarray):
            # Small buffers are cheaper to copy than to track (zmq's own threshold idea).
            copy = frame.nbytes < 16_384
            sock.send(frame.data.cast("B") if frame.nbytes else b"", part_flags, copy=copy)
        else:
            sock.send(frame, part_flags, copy=not isinstance(frame, zmq.Frame))


def recv_frames(sock: zmq.Socket, *, block: bool = True) -> list[zmq.Frame]:
    """One multipart message as zmq Frames (zero-copy views of the received parts).

    Each part's own ``more`` flag says whether another follows (pyzmq's
    ``recv_multipart`` asks the socket instead, one option call per part). A message's
    parts arrive together, so only the first part can find nothing (``block=False``:
    raises ``zmq.Again``).
    """
    flags = 0 if block else _NOBLOCK
    frames = [sock.recv(flags, copy=False)]
    while frames[-1].more:
        frames.append(sock.recv(flags, copy=False))
    return frames
