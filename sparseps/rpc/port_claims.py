"""Claims on the ports :func:`~sparseps.rpc.transport.free_ports` hands out, seen by every
process of this user on this machine.

A drawn port is free when drawn, but its server binds it a second or more later. In that
window another process drawing at random (a second launcher, a test beside it) can draw the
same port, and one of the two servers then fails to bind ("Address already in use"; the
test suite, two launchers at a time, met it about once in ten runs). So a process that
draws a port claims it: a POSIX lock on that port's byte of one file in the temporary
folder, held for :data:`CLAIM_S` seconds (a server binds well within it; after that the
bind itself keeps others off) or until the process exits, which releases its locks. A
port claimed by another process, or by this one, is not handed out.

Where the file cannot be opened or locked (another user's file, a file system without
locks, no ``fcntl``), claims are off and drawing works as before.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["CLAIM_S", "PortClaims", "claims"]

CLAIM_S = 120.0
_BUSY = (errno.EAGAIN, errno.EACCES)  # lockf's "another process holds it"


class PortClaims:
    """This process's claims on ports, through byte locks on ``path``.

    Args:
        path: the lock file (created if missing, never truncated).
        hold_s: seconds a claim is held.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self, path: Path, hold_s: float = CLAIM_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.hold_s = hold_s
        self._clock = clock
        self._fd: int | None = None
        self._opened = False
        self._held: dict[int, float] = {}  # port -> when claimed
        self._lock = threading.Lock()

    def claim(self, port: int) -> bool:
        """True if no process holds ``port`` (it is now held here); False if one does."""
        with self._lock:
            self._release_expired()
            if port in self._held:  # POSIX locks do not exclude their own process
                return False
            fd = self._file()
            if fd is None:
                return True
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except OSError as exc:  # busy: another process's; else no locks here (claims off)
                return exc.errno not in _BUSY
            self._held[port] = self._clock()
            return True

    def held(self) -> list[int]:
        """The ports this process holds now."""
        with self._lock:
            self._release_expired()
            return sorted(self._held)

    def _release_expired(self) -> None:
        now = self._clock()
        for port, since in list(self._held.items()):
            if now - since >= self.hold_s:
                del self._held[port]
                if self._fd is not None:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, port)

    def _file(self) -> int | None:
        # Opened once and never closed: closing any descriptor of the file would drop
        # every lock this process holds on it.
        if not self._opened:
            self._opened = True
            if fcntl is not None:
                try:
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                except OSError:
                    self._fd = None
        return self._fd


def _default_path() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"sparseps-ports-{uid}.lock"


claims = PortClaims(_default_path())
