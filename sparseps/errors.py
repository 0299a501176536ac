"""The sparseps exception hierarchy.

Every error raised on purpose by sparseps derives from :class:`SparsePSError`, so a
caller can catch one base class. The subclasses say *what kind* of thing broke:

- :class:`ConfigError`     a value given by the user (argument, config file, env) is wrong.
- :class:`InputError`      data handed to an API (array dtype/shape, data file line) is wrong.
- :class:`ProtocolError`   a network frame does not follow the wire protocol.
- :class:`UnavailableError` a peer process is gone or refused the connection.
- :class:`DeadlineError`   a blocking call waited longer than its limit (names op, peer,
  seconds and the setting that changes the limit).
- :class:`RemoteError`     the peer raised; carries the remote type, message and traceback.
- :class:`CheckpointError` a model directory is incomplete, corrupt or does not match.
- :class:`ResourceError`   memory (or another resource) ran out; the operation was undone.

All exceptions pickle (they travel between processes), which is why the ones with
extra fields rebuild themselves from keyword arguments in ``__reduce__``.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InputError",
    "ProtocolError",
    "RemoteError",
    "ResourceError",
    "DeadlineError",
    "SparsePSError",
    "UnavailableError",
]


class SparsePSError(Exception):
    """Base class of every error sparseps raises on purpose."""


class ConfigError(SparsePSError, ValueError):
    """A configuration value is invalid (names the field, the value and what is accepted)."""


class InputError(SparsePSError, ValueError):
    """An argument or a data record is malformed (wrong dtype, shape, bad line...)."""


class ProtocolError(SparsePSError):
    """A message on the wire does not follow the protocol."""


class CheckpointError(SparsePSError):
    """A model directory is missing, incomplete, corrupt or does not match the model."""


class ResourceError(SparsePSError, MemoryError):
    """Memory ran out: names what needed it and how many bytes; nothing was changed."""


class _PeerError(SparsePSError):
    """An error about a peer process; keeps its fields through pickling."""

    _fields: tuple[str, ...] = ()

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        self.message = message
        for name in self._fields:
            setattr(self, name, fields.get(name))

    def __reduce__(self) -> tuple:  # pragma: no cover - exercised by pickle tests
        fields = {name: getattr(self, name) for name in self._fields}
        return (_rebuild, (type(self), self.message, fields))


def _rebuild(cls, message, fields):
    return cls(message, **fields)


class UnavailableError(_PeerError):
    """A peer is unreachable or died (names op, role, rank and address)."""

    _fields = ("op", "role", "rank", "address")
    op: str | None
    role: str | None
    rank: int | None
    address: str | None


class DeadlineError(_PeerError, TimeoutError):
    """A blocking call exceeded its time limit.

    Attributes:
        op: the operation that was waiting (``"pull"``, ``"barrier"`` ...).
        role, rank, address: the peer that did not answer.
        seconds: how long the call waited.
        setting: the name of the setting (argument or env var) that changes the limit.
    """

    _fields = ("op", "role", "rank", "address", "seconds", "setting")
    op: str | None
    role: str | None
    rank: int | None
    address: str | None
    seconds: float | None
    setting: str | None


class RemoteError(_PeerError):
    """The peer raised while serving a request.

    Attributes:
        remote_type: the exception class name on the peer.
        remote_traceback: the formatted traceback from the peer (may be empty).
        role, rank, address: which peer.
    """

    _fields = ("remote_type", "remote_traceback", "role", "rank", "address", "op")
    remote_type: str | None
    remote_traceback: str | None
    role: str | None
    rank: int | None
    address: str | None
    op: str | None
