"""Client side of the wire: protocol (framing + validation), zmq transport, PSClient."""

from __future__ import annotations

from .client import DEFAULT_TIMEOUT, Handle, PSClient
from .protocol import PROTOCOL_VERSION, Limits

__all__ = ["DEFAULT_TIMEOUT", "PROTOCOL_VERSION", "Handle", "Limits", "PSClient"]
