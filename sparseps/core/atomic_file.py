"""Write a file so that readers see the old one or the whole new one, never a torn one.

    with replaced_atomically(path) as tmp:
        write(tmp)          # any writer: numpy, pyarrow, json, ...

The block writes a temporary sibling, ``.{name}.tmp-{pid}`` (hidden, and recognised as a
temporary by the model-file checks), which replaces ``path`` in one ``rename`` once the
block returns. When the block raises (a full disk, a failed encoder, an interrupt) the
temporary is removed before the error goes on: a failed write leaves neither a torn file
at ``path`` nor a partial one beside it holding the disk's space.

Durability is the caller's choice: ``sync=True`` flushes the temporary to disk before the
rename and the folder's entry after it; writers that fsync themselves (overlapping it with
other work) pass ``False``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replaced_atomically", "temporary_name"]


def temporary_name(path: Path) -> Path:
    """The temporary sibling that :func:`replaced_atomically` writes for ``path``."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike, *, sync: bool = False) -> Iterator[Path]:
    """Yield the temporary path to write; on success it replaces ``path`` (module docstring).

    The parent folder must exist. ``sync``: fsync the file before the rename and the
    folder after it.
    """
    target = Path(path)
    tmp = temporary_name(target)
    try:
        yield tmp
        if sync:
            _fsync(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if sync:
        _fsync(target.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # a folder too: its entry for the renamed file
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
