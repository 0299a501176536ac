"""Counting what a dataset read, and the bad-line policy.

Policy (DESIGN §6): by default a bad line is counted and skipped, and the first
:data:`EXAMPLES` of each pass are logged as ``file:line: reason``; with ``strict=True``
the first bad line raises :class:`~sparseps.errors.InputError` naming ``file:line`` and
the reason. ``dataset.stats()`` returns a :class:`DatasetStats`.

No silent data loss: at the end of a pass, if every line this worker read was bad, or
more than ``max_bad_ratio`` (default :data:`MAX_BAD_RATIO`, 1 in 100) of its lines
(good + bad; blank lines do not count) were bad, the pass raises
:class:`~sparseps.errors.InputError` naming the format, the first bad lines
(``file:line: reason``) and, when those lines parse cleanly in another supported format,
that format (``... look like multislot; pass format="multislot"``). Each worker judges
its own share. The error comes when the pass's last chunk has been read: a QueueDataset
pass has handed out its good batches by then (the trainer has trained on them); an
InMemoryDataset raises from ``load_into_memory`` before anything is trained.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:  # a type only: the online config reads MAX_BAD_RATIO without pyarrow
    from .columns import Parsed

__all__ = ["EXAMPLES", "MAX_BAD_RATIO", "DatasetStats", "PassCounter", "PassStats"]

log = logging.getLogger(__name__)

EXAMPLES = 5
MAX_BAD_RATIO = 0.01  # the default share of bad lines above which a pass fails


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

    def __init__(self, *, strict: bool, name: str = "dataset", max_bad_ratio: float = MAX_BAD_RATIO,
                 format: str = "", guess=None) -> None:  # fmt: skip
        """``guess(text) -> format or None``: another format the bad lines' text parses in."""
        self.strict = strict
        self.name = name
        self.max_bad_ratio = max_bad_ratio
        self.format = format
        self.guess = guess
        self.bad_text: list[bytes] = []
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
            if len(self.bad_text) < EXAMPLES:
                self.bad_text.extend(parsed.bad_text[: EXAMPLES - len(self.bad_text)])
        for text in new:
            log.warning("%s: skipped bad line %s", self.name, text)

    def file_done(self) -> None:
        with self._lock:
            self.files += 1

    def finish(self) -> None:
        """End the pass.

        Raises:
            InputError: every line was bad, or more than ``max_bad_ratio`` of them.
        """
        self._end = time.perf_counter()
        if not self.bad:
            return
        lines = self.rows + self.bad
        if self.rows == 0 or self.bad > self.max_bad_ratio * lines:
            raise InputError(self._message(lines))
        log.warning(
            "%s: pass done, %d rows, %d bad lines skipped (first: %s)",
            self.name, self.rows, self.bad, self.examples[0] if self.examples else "?",
        )  # fmt: skip

    def _message(self, lines: int) -> str:
        what = "every line" if self.rows == 0 else f"{self.bad} of {lines} lines"
        text = (
            f"{self.name} pass: {what} read as format={self.format!r} "
            f"{'was' if self.rows == 0 else 'were'} bad ({self.bad / lines:.1%}; "
            f"max_bad_ratio={self.max_bad_ratio:g}); first bad lines: " + "; ".join(self.examples)
        )
        other = None
        if self.guess is not None and self.bad_text:
            try:
                other = self.guess(b"\n".join(self.bad_text) + b"\n")
            except Exception:  # a guess is a hint: never let it hide the real error
                log.debug("format guess failed", exc_info=True)
        if other:
            text += f'. The bad lines look like {other}; pass format="{other}"'
        elif self.rows:
            text += ". Fix the data or raise max_bad_ratio= to skip more bad lines"
        return text

    def snapshot(self) -> PassStats:
        with self._lock:
            end = self._end if self._end is not None else time.perf_counter()
            return PassStats(
                self.rows, self.bad, self.files, end - self._start, tuple(self.examples)
            )
