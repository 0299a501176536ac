"""The size limits every decoded message is held to, and the room a header needs.

A server refuses, before reading it, a message over ``max_message_bytes`` (zmq's
``MAXMSGSIZE`` drops the connection) and a reply it could not send in one message
(:attr:`Limits.max_payload_bytes`); the client applies the same limits to what it
receives. :mod:`.protocol` checks them while decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["HEADER_ROOM", "Limits"]

# Bytes kept free for the msgpack header when one bulk buffer must fit in a message with
# it. Headers of data messages are a few hundred bytes (a table name is at most 256 chars).
HEADER_ROOM = 4096


@dataclass(frozen=True)
class Limits:
    """Size limits applied to every decoded message.

    Attributes:
        max_message_bytes: total bytes of all frames of one message (default 1 GiB).
        max_header_bytes: bytes of the msgpack header frame (default 1 MiB: headers hold
            scalars, table configs and file lists, never bulk data).
        max_buffers: buffer frames in one message.
    """

    max_message_bytes: int = 1 << 30
    max_header_bytes: int = 1 << 20
    max_buffers: int = 16

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_header_bytes", "max_buffers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Limits.{name}: expected an integer >= 1, got {value!r}")

    @property
    def max_payload_bytes(self) -> int:
        """Bytes of bulk data (one reply's rows, one dense vector) that fit in one message
        beside its header: ``max_message_bytes - HEADER_ROOM``."""
        return max(0, self.max_message_bytes - HEADER_ROOM)

    @property
    def max_dense_size(self) -> int:
        """Floats in one dense table: it is pulled and pushed whole, in one message.

        With its optimizer state (Adam keeps two more floats per value) a dense table then
        holds at most about ``3 * max_message_bytes`` bytes of server memory.
        """
        return self.max_payload_bytes // 4
