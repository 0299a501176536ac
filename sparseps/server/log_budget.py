"""``LogBudget``: at most a few log lines per kind of event per interval.

A peer that sends bad messages in a loop must not fill the server's disk with one warning
per message. Each kind (e.g. ``bad_message``, ``job_mismatch``) may log ``burst`` lines
per ``interval_s``; the rest are counted, and the next line that is allowed says how many
were suppressed. The counters in ``stats`` still count every event.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["LogBudget"]


class LogBudget:
    """Rate-limited logging per event kind.

    Args:
        logger: where lines go.
        burst: lines allowed per kind in one interval.
        interval_s: length of an interval.
        clock: monotonic clock (tests pass a fake one).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        interval_s: float = 60.0,
        clock=time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, list] = {}  # kind -> [interval start, lines, suppressed]

    def log(self, level: int, kind: str, message: str, *args, exc_info=None) -> bool:
        """Log ``message % args`` unless ``kind`` is over budget; True when it was logged."""
        now = self._clock()
        with self._lock:
            record = self._kinds.setdefault(kind, [now, 0, 0])
            if now - record[0] >= self.interval_s:
                record[0], record[1] = now, 0
            if record[1] >= self.burst:
                record[2] += 1
                return False
            record[1] += 1
            suppressed, record[2] = record[2], 0
        if suppressed:
            message += f" ({suppressed} similar lines suppressed)"
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True
