"""Which paths a server's file ops may touch, and the writer lock around its writes.

**Roots.** ``save``/``load`` and the dense and inference file ops take paths from the
request. A server started with file roots (``--file-root DIR``, repeatable, or
``SPARSEPS_FILE_ROOTS=DIR:DIR``) accepts only absolute paths that resolve (symlinks and
``..`` followed) inside one of them, so a peer cannot make it write into, or probe, any
folder the server process can reach. Without roots every path is accepted (one-host jobs;
see docs/security.md).

**Writer lock.** Writes hold :func:`sparseps.files.writer_lock.writer_lock` on the folder
(see there); the checkpoint code reads it with ``being_written``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import InputError
from ..files.writer_lock import writer_lock
from ..rpc.protocol import Request

__all__ = ["FileGuard"]

# op -> (argument holding a path or a list of paths, whether the op writes there)
FILE_ARGS = {
    "save": ("directory", True),
    "save_dense": ("directory", True),
    "save_inference": ("directory", True),
    "load": ("files", False),
    "load_dense": ("path", False),
    "replicate": ("directory", True),  # a survivor saves a shard for a replacement
}


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
