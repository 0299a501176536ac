"""A server's disk dir: where its tiered tables keep the rows beyond their memory budget.

The folder given with ``--disk-dir DIR`` (or ``SPARSEPS_DISK_DIR``) may be shared by the
servers of one machine, so each server owns a subfolder ``DIR/server-RANK``, held with an
exclusive ``flock`` for the server's lifetime: a second live server of the same rank on the
same folder (two jobs given one dir) is refused instead of corrupting the other's files.

What is in it is a cache, never durable state (checkpoints are): a server deletes the row
files a crashed predecessor left behind when it takes the folder, and its own when it
stops. Only files this module's tables create (``*.rows``) are deleted; nothing else in
``DIR`` is touched.
"""

from __future__ import annotations

import fcntl
import logging
import os

from ..core.closing import Closing
from ..errors import ConfigError

__all__ = ["DiskDir"]

log = logging.getLogger(__name__)

ROW_FILE_SUFFIX = ".rows"


class DiskDir(Closing):
    """Take ``root/server-RANK`` for this process (see module doc).

    Args:
        root: the server's ``--disk-dir``.
        rank: the server's rank.

    Raises:
        ConfigError: the folder cannot be created or written, or another live process holds it.
    """

    def __init__(self, root: str, rank: int) -> None:
        self.path = os.path.join(os.path.abspath(root), f"server-{rank:05d}")
        try:
            os.makedirs(self.path, exist_ok=True)
            self._lock = os.open(os.path.join(self.path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"server {rank}: cannot use disk dir {self.path} (--disk-dir / "
                f"SPARSEPS_DISK_DIR): {exc.strerror}"
            ) from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock)
            raise ConfigError(
                f"server {rank}: disk dir {self.path} is in use by another live server "
                "process; give each job its own --disk-dir"
            ) from None
        stale = self._remove_row_files()
        if stale:
            log.info(
                "server %d: removed %d row file(s) of a previous server from %s (the disk "
                "tier is a cache; tables start from their checkpoint)", rank, stale, self.path,
            )  # fmt: skip

    def _remove_row_files(self) -> int:
        removed = 0
        for name in os.listdir(self.path):
            if name.endswith(ROW_FILE_SUFFIX):
                os.unlink(os.path.join(self.path, name))
                removed += 1
        return removed

    def close(self) -> None:
        """Release the folder (the tables have deleted their files by then)."""
        if self._lock >= 0:
            self._remove_row_files()
            os.close(self._lock)
            self._lock = -1
