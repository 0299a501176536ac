"""Client side of the wire: protocol (framing + validation), zmq transport, PSClient.

The client's names load on first use: a launcher imports :mod:`.transport` (ports,
sockets) and must not pay for the client's compiled kernels (numba) to start a job.
"""

from __future__ import annotations

from ..core.lazy import lazy_names

__all__ = ["DEFAULT_TIMEOUT", "PROTOCOL_VERSION", "ClientConfig", "Handle", "Limits", "PSClient"]

__getattr__ = lazy_names(
    __name__,
    {
        "DEFAULT_TIMEOUT": "client",
        "ClientConfig": "client_config",
        "Handle": "client",
        "PSClient": "client",
        "PROTOCOL_VERSION": "protocol",
        "Limits": "protocol",
    },
)
