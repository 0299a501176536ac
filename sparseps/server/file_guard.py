"""Which paths a server's file ops may touch, and a lock that marks a folder being written.

**Roots.** ``save``/``load`` and the dense and inference file ops take paths from the
request. A server started with file roots (``--file-root DIR``, repeatable, or
``SPARSEPS_FILE_ROOTS=DIR:DIR``) accepts only absolute paths that resolve (symlinks and
``..`` followed) inside one of them, so a peer cannot make it write into, or probe, any
folder the server process can reach. Without roots every path is accepted (one-host jobs;
see docs/security.md).

**Writer lock.** While a server writes into a folder it holds an exclusive ``flock`` on
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
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import InputError
from ..rpc.protocol import Request

__all__ = ["FileGuard", "being_written", "writer_lock"]

# op -> (argument holding a path or a list of paths, whether the op writes there)
FILE_ARGS = {
    "save": ("directory", True),
    "save_dense": ("directory", True),
    "save_inference": ("directory", True),
    "load": ("files", False),
    "load_dense": ("path", False),
}
LOCK_PREFIX = ".writing-"


class FileGuard:
    """Checks the paths of file ops against the server's roots.

    Args:
        roots: folders the file ops may use (None or empty: any path).
        rank: the server's rank (names its writer lock).
    """

    def __init__(self, roots: Sequence[str] | None, rank: int) -> None:
        self.roots = tuple(os.path.realpath(root) for root in roots or ())
        self.rank = rank

    def paths(self, request: Request) -> list[str]:
        """The paths named by a file op's arguments (empty for other ops)."""
        spec = FILE_ARGS.get(request.op)
        if spec is None:
            return []
        value = request.args.get(spec[0])
        items = value if isinstance(value, list) else [value]
        out = []
        for item in items:
            path = item.get("path") if isinstance(item, dict) else item
            if not isinstance(path, str):
                raise InputError(f"{request.op}: a path must be a string, got {path!r:.60}")
            out.append(path)
        return out

    def check(self, request: Request) -> None:
        """Refuse paths that are relative, hold NUL, or lie outside every root.

        Raises:
            InputError: naming the op, the path and the roots.
        """
        for path in self.paths(request):
            if "\x00" in path or not os.path.isabs(path):
                raise InputError(f"{request.op}: paths must be absolute, got {path!r:.200}")
            if not self.roots:
                continue
            real = os.path.realpath(path)
            if not any(real == root or real.startswith(root + os.sep) for root in self.roots):
                raise InputError(
                    f"{request.op}: {path!r:.200} is outside this server's file roots "
                    f"{list(self.roots)}; save and load under them (the servers' --file-root "
                    "or SPARSEPS_FILE_ROOTS sets them)"
                )

    @contextlib.contextmanager
    def writing(self, request: Request) -> Iterator[None]:
        """Hold the writer lock of the folder a writing op writes into."""
        spec = FILE_ARGS.get(request.op)
        if spec is None or not spec[1]:
            yield
            return
        with writer_lock(Path(request.args[spec[0]]), f"{self.rank}-{os.getpid()}"):
            yield


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
