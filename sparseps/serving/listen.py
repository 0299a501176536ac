"""The service's listening socket: bound once (by the one process, or by the supervisor
of ``--workers N``, whose workers inherit it), so every process answers on one port."""

from __future__ import annotations

import socket

from ..errors import ConfigError

__all__ = ["bind"]


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY on accepted connections only when the
    # socket says IPPROTO_TCP; with proto 0, Nagle held each response's body back until the
    # client's delayed ACK of its headers: 40+ ms per request on a kept-alive connection
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"serve: cannot listen on {host}:{port} ({exc}); pick another --port"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
