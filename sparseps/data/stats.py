"""Counting what a dataset read, and the bad-line policy.

Policy (DESIGN §6): by default a bad line is counted and skipped, and the first
:data:`EXAMPLES` of each pass are logged as ``file:line: reason``; with ``strict=True``
the first bad line raises :class:`~sparseps.errors.InputError` naming ``file:line`` and
the reason. ``dataset.stats()`` returns a :class:`DatasetStats`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ..errors import InputError
from .columns import Parsed

__all__ = ["EXAMPLES", "DatasetStats", "PassCounter", "PassStats"]

log = logging.getLogger(__name__)

EXAMPLES = 5


@dataclass(frozen=True)
class PassStats:
    """One pass over this worker's files."""

    rows: int
    bad_lines: int
    files: int
    seconds: float
    bad_examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetStats:
    """What a dataset has read on this worker.

    Attributes:
        rows: good samples read, over all passes.
        bad_lines: bad lines skipped, over all passes.
        files: this worker's share of the files (each pass reads them all).
        passes: per-pass counts, in order (the last may be in progress).
    """

    rows: int
    bad_lines: int
    files: int
    passes: tuple[PassStats, ...]


class PassCounter:
    """Thread-safe counts of one pass; applies the bad-line policy."""

    def __init__(self, *, strict: bool, name: str = "dataset") -> None:
        self.strict = strict
        self.name = name
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._end: float | None = None
        self.rows = 0
        self.bad = 0
        self.files = 0
        self.examples: list[str] = []

    def add(self, path: str, parsed: Parsed) -> None:
        """Count a parsed chunk of ``path``.

        Raises:
            InputError: ``strict`` and the chunk had a bad line (names the first one).
        """
        if parsed.bad and self.strict:
            line, reason = parsed.examples[0] if parsed.examples else (0, "bad line")
            raise InputError(
                f"{path}:{line}: {reason} (strict=True stops at the first bad line; "
                "strict=False counts and skips bad lines)"
            )
        with self._lock:
            self.rows += len(parsed.batch)
            self.bad += parsed.bad
            room = EXAMPLES - len(self.examples)
            new = [f"{path}:{line}: {reason}" for line, reason in parsed.examples[:room]]
            self.examples.extend(new)
        for text in new:
            log.warning("%s: skipped bad line %s", self.name, text)

    def file_done(self) -> None:
        with self._lock:
            self.files += 1

    def finish(self) -> None:
        self._end = time.perf_counter()
        if self.bad:
            log.warning(
                "%s: pass done, %d rows, %d bad lines skipped (first: %s)",
                self.name, self.rows, self.bad, self.examples[0] if self.examples else "?",
            )  # fmt: skip

    def snapshot(self) -> PassStats:
        with self._lock:
            end = self._end if self._end is not None else time.perf_counter()
            return PassStats(
                self.rows, self.bad, self.files, end - self._start, tuple(self.examples)
            )
