"""A default console for sparseps's log lines when the application configured no logging.

Python drops INFO records when nobody configured logging, so a script run with plain
``python train.py`` would never show the local-mode line or the trainer's progress
lines (``time: [...], batch: [N], loss: [...]``). :func:`ensure_default_logging`, called
by ``sps.init()``, attaches a stderr handler at INFO to the ``sparseps`` logger, but only
when neither the root logger nor the ``sparseps`` logger has a handler: an application
that configured logging keeps full control.

The handler steps aside by itself when the application configures logging *after*
``sps.init()`` (``logging.basicConfig`` in the script, or the server's own set-up): on
its next record it sees a root handler, removes itself and undoes the level it set, so
no line is printed twice.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

from ..core.closing import Closing

__all__ = ["LOG_FORMAT", "LauncherLog", "ensure_default_logging"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_PACKAGE = "sparseps"


class _DefaultHandler(logging.StreamHandler):
    """stderr (looked up at each record, so redirections of ``sys.stderr`` are followed)."""

    def __init__(self, *, set_level: bool) -> None:
        super().__init__()
        self.set_level = set_level  # True: we raised the package logger to INFO

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; always stderr
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:  # the application configured logging after init()
            self.step_aside()
            return  # the record still propagates to the application's handlers
        super().emit(record)

    def step_aside(self) -> None:
        package = logging.getLogger(_PACKAGE)
        package.removeHandler(self)
        if self.set_level and package.level == logging.INFO:
            package.setLevel(logging.NOTSET)


def ensure_default_logging() -> bool:
    """Attach the default stderr handler (INFO) to ``sparseps`` if nothing is configured.

    Returns:
        True if the handler was attached (or already is), False if the application
        configured logging itself.
    """
    root, package = logging.getLogger(), logging.getLogger(_PACKAGE)
    if any(isinstance(h, _DefaultHandler) for h in package.handlers):
        return True
    if root.handlers or package.handlers:
        return False
    # Only an unset level is raised: a level the application chose is kept.
    set_level = package.level == logging.NOTSET
    handler = _DefaultHandler(set_level=set_level)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    package.addHandler(handler)
    if set_level:
        package.setLevel(logging.INFO)
    return True


class LauncherLog(Closing):
    """``LOG_DIR/launcher.log``: the launcher's own messages, as on its console.

    Log records of the ``sparseps`` loggers (quiet-process warnings, restarts, failures)
    are copied there by a handler, and :meth:`say` prints a line (the banner, the final
    summary) to a console stream and to the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._handler = logging.StreamHandler(self._file)
        self._handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger("sparseps").addHandler(self._handler)

    def say(self, text: str, stream: TextIO | None = None) -> None:
        """Print ``text`` to ``stream`` (None: the file only) and append it to the file."""
        if stream is not None:
            print(text, file=stream, flush=True)
        self._handler.acquire()  # not interleaved with a record being written
        try:
            self._file.write(text + "\n")
            self._file.flush()
        finally:
            self._handler.release()

    def close(self) -> None:
        logging.getLogger("sparseps").removeHandler(self._handler)
        self._handler.close()
        self._file.close()
