"""Crash-safe folder replacement: write a model folder beside its target, then swap it in.

A save never writes into the folder readers load. It writes a *staging* sibling
``.{name}.saving-{token}``, writes the manifest there last, and only then puts the
folder in place:

- the target does not exist: one ``rename`` (atomic);
- the target exists (saving a checkpoint over an older one): on Linux one
  ``renameat2(RENAME_EXCHANGE)`` swaps the two folders atomically, so the path always
  holds a complete checkpoint — the old one until the exchange, the new one after it.
  Where the exchange is not available the old folder is first renamed to
  ``.{name}.replaced-{token}``, then the new one into place: a crash between the two
  renames leaves no folder at the path, which :func:`missing_report` explains (and
  :func:`recover` undoes at the start of the next save);
- the old folder, now under a hidden name, is removed.

A crash before the swap leaves the target as it was plus a staging folder that the next
save to the same target removes. Loaders only ever read the target path, so they never
see a half-written folder.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import uuid
from pathlib import Path

from ..errors import CheckpointError
from ..files import manifest as mf
from ..files.writer_lock import being_written
from .hooks import NO_HOOKS, SaveHooks

__all__ = ["commit", "leftovers", "missing_report", "new_staging", "recover", "remove_stale"]

log = logging.getLogger(__name__)

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_SAVING, _REPLACED = "saving", "replaced"


def _hidden(target: Path, kind: str) -> str:
    return f".{target.name}.{kind}-"


def leftovers(target: Path, kind: str) -> list[Path]:
    """Hidden siblings of ``target`` that a save of ``kind`` (saving/replaced) left behind."""
    prefix = _hidden(target, kind)
    parent = target.parent
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.name.startswith(prefix) and p.is_dir())


def new_staging(target: Path) -> Path:
    """Create and return an empty staging folder beside ``target`` (same file system)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    folder = target.parent / f"{_hidden(target, _SAVING)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return folder


def remove_stale(target: Path) -> None:
    """Remove staging folders of earlier, interrupted saves to ``target``.

    Called by the single writer of ``target`` at the start of a save, after :func:`recover`.
    """
    for folder in leftovers(target, _SAVING):
        if being_written(folder):
            # an earlier attempt whose client gave up while a server still writes it
            log.warning(
                "%s: leaving %s in place: a server is still writing it (an earlier save "
                "attempt that timed out); the next save removes it", target, folder.name,
            )  # fmt: skip
            continue
        log.warning("%s: removing %s left by an interrupted save", target, folder.name)
        shutil.rmtree(folder, ignore_errors=True)
    if target.is_dir():
        for folder in leftovers(target, _REPLACED):
            shutil.rmtree(folder, ignore_errors=True)


def recover(target: Path) -> None:
    """Undo a swap that stopped between its two renames: put the old folder back.

    Only the non-atomic fallback can leave this state (no folder at ``target``, the
    previous one under ``.{name}.replaced-*``).
    """
    if target.exists():
        return
    replaced = [p for p in leftovers(target, _REPLACED) if (p / mf.MANIFEST).is_file()]
    if replaced:
        log.warning("%s: restoring %s (a save stopped mid-swap)", target, replaced[-1].name)
        os.rename(replaced[-1], target)
        _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where the kernel/fs cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "renameat2", None)
    if function is None:
        return False
    result = function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, f"renameat2(RENAME_EXCHANGE) {a} <-> {b}: {os.strerror(code)}")


def commit(
    staging: Path, target: Path, *, exchange: bool = True, hooks: SaveHooks = NO_HOOKS
) -> None:
    """Put the complete ``staging`` folder (its manifest written) at ``target``.

    Args:
        staging: a folder from :func:`new_staging` holding a complete save.
        target: the path readers load.
        exchange: try the atomic exchange first (tests turn it off to cover the fallback).
        hooks: fault injection for tests (``hooks.between_renames(target)`` is called
            between the fallback's two renames).
    """
    if not (staging / mf.MANIFEST).is_file():
        raise CheckpointError(f"{staging}: has no {mf.MANIFEST}; refusing to put it at {target}")
    if not target.exists():
        os.rename(staging, target)
        _fsync_dir(target.parent)
        return
    if exchange and _exchange(staging, target):
        _fsync_dir(target.parent)
        shutil.rmtree(staging, ignore_errors=True)  # it now holds the old folder
        return
    token = staging.name[len(_hidden(target, _SAVING)) :]
    aside = target.parent / f"{_hidden(target, _REPLACED)}{token}"
    os.rename(target, aside)
    hooks.between_renames(target)
    os.rename(staging, target)
    _fsync_dir(target.parent)
    shutil.rmtree(aside, ignore_errors=True)


def missing_report(target: Path) -> str:
    """Why there is no folder at ``target``, and what to do, from the leftovers beside it."""
    complete: list[str] = []
    partial: list[str] = []
    for folder in leftovers(target, _REPLACED) + leftovers(target, _SAVING):
        (complete if (folder / mf.MANIFEST).is_file() else partial).append(folder.name)
    if not complete and not partial:
        return f"{target}: no such model directory"
    message = f"{target}: no such model directory; a save to it was interrupted"
    if complete:
        message += (
            f" and left complete folder(s) {complete} beside it: rename the one you want to "
            f"{target.name} (or save again; the next save restores .replaced-*)"
        )
    if partial:
        message += f"; incomplete folder(s) {partial} are not loadable and can be deleted"
    return message
