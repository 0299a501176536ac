"""Client side of the wire: protocol (framing + validation), zmq transport, PSClient.

The client's names load on first use: a launcher imports :mod:`.transport` (ports,
sockets) and must not pay for the client's compiled kernels (numba) to start a job.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_TIMEOUT", "PROTOCOL_VERSION", "Handle", "Limits", "PSClient"]

_WHERE = {
    "DEFAULT_TIMEOUT": "client",
    "Handle": "client",
    "PSClient": "client",
    "PROTOCOL_VERSION": "protocol",
    "Limits": "protocol",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sparseps.rpc' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
