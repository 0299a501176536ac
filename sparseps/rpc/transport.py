"""zmq plumbing shared by the client and the server: sockets, addresses, zero-copy sends.

Nothing here knows about ops or tables; it only creates sockets with the options the
protocol relies on and moves frames.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

import numpy as np
import zmq

from ..env import parse_endpoint
from .security import Security

__all__ = [
    "bind_address",
    "connect_address",
    "free_port",
    "new_context",
    "new_dealer",
    "new_router",
    "send_frames",
]

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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller must cope with a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = zmq.SNDMORE if i < last else 0
        if isinstance(frame, np.ndarray):
            # Small buffers are cheaper to copy than to track (zmq's own threshold idea).
            copy = frame.nbytes < 16_384
            sock.send(frame.data.cast("B") if frame.nbytes else b"", flags | more, copy=copy)
        else:
            sock.send(frame, flags | more, copy=not isinstance(frame, zmq.Frame))
