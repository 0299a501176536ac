"""A lock that marks a folder being written (servers write, the checkpoint code looks).

While a server writes into a folder it holds an exclusive ``flock`` on
``.writing-<rank>-<pid>.lock`` there; the file is removed when the write ends. A save that
is retried after a timeout cleans up the staging folders of earlier attempts
(:func:`sparseps.checkpoint.staging.remove_stale`) and skips the ones still locked, so it
never deletes a folder under a server that is still writing it. The OS drops the lock if
the server dies, and the folder becomes removable.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_PREFIX", "being_written", "writer_lock"]

LOCK_PREFIX = ".writing-"


@contextlib.contextmanager
def writer_lock(folder: Path, tag: str) -> Iterator[None]:
    """Create ``folder`` if needed and hold ``folder/.writing-<tag>.lock`` while writing."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{LOCK_PREFIX}{tag}.lock"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)  # closing releases the lock


def being_written(folder: Path) -> bool:
    """Whether some process holds a writer lock in ``folder`` right now."""
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(LOCK_PREFIX)]
    except OSError:
        return False
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # removed meanwhile: that writer is done
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False
