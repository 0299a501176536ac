"""Time-partitioned data: which folders make a pass, and waiting for their done-markers.

A stream is cut into splits of ``split_minutes``; split ``i`` of day ``D`` lives in
``root / pattern.format(day=D, hhmm=...)`` (e.g. ``root/20240101/0005``) and is complete
once its done-marker (``_SUCCESS``) exists: writers put it last, so a reader never sees
a half-written split. A pass is ``splits_per_pass`` consecutive splits; passes are
numbered within a day and, across days, by a sequence number ``seq``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import DeadlineError
from .config import OnlineConfig

__all__ = ["DataLayout", "PassId"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class PassId:
    """One pass: its global sequence number, its day and its index within the day."""

    seq: int
    day: str  # YYYYMMDD
    index: int

    def __str__(self) -> str:
        return f"{self.day}/pass-{self.index:03d} (seq {self.seq})"


class DataLayout:
    """The passes of a job and the split folders of each.

    Args:
        config: the validated online config.
    """

    def __init__(self, config: OnlineConfig) -> None:
        self.config = config
        self.data = config.data
        self.root = Path(self.data.root)
        self.per_day = config.passes_per_day

    def passes(self) -> list[PassId]:
        """Every pass of the schedule, in order."""
        start = dt.datetime.strptime(self.config.schedule.start_day, "%Y%m%d").date()
        out: list[PassId] = []
        for d in range(self.config.schedule.days):
            day = (start + dt.timedelta(days=d)).strftime("%Y%m%d")
            out.extend(PassId(d * self.per_day + p, day, p) for p in range(self.per_day))
        return out

    def is_last_of_day(self, pass_id: PassId) -> bool:
        return pass_id.index == self.per_day - 1

    def split_path(self, day: str, split: int) -> Path:
        """The folder of split ``split`` (0-based) of ``day``."""
        minute = split * self.data.split_minutes
        hour, mm = divmod(minute, 60)
        return self.root / self.data.pattern.format(
            day=day, hhmm=f"{hour:02d}{mm:02d}", year=day[:4], month=day[4:6], dd=day[6:],
            hour=f"{hour:02d}", minute=f"{mm:02d}",
        )  # fmt: skip

    def splits(self, pass_id: PassId) -> list[Path]:
        """The split folders of a pass, in time order."""
        first = pass_id.index * self.data.splits_per_pass
        return [self.split_path(pass_id.day, first + i) for i in range(self.data.splits_per_pass)]

    def wait_ready(self, pass_id: PassId, *, timeout: float | None = None) -> list[Path]:
        """Wait until every split of the pass has its done-marker; returns the folders.

        Raises:
            DeadlineError: a marker is still missing after ``timeout`` seconds (default
                ``data.wait_timeout_s``); names the split, the marker and the setting.
        """
        timeout = self.data.wait_timeout_s if timeout is None else timeout
        start = time.monotonic()
        folders = self.splits(pass_id)
        for folder in folders:
            marker = folder / self.data.done_marker
            logged = False
            while not marker.is_file():
                waited = time.monotonic() - start
                if waited >= timeout:
                    raise DeadlineError(
                        f"pass {pass_id}: split {folder} is not complete: its done-marker "
                        f"{self.data.done_marker!r} did not appear within {timeout:.0f} s "
                        "(raise data.wait_timeout_s to wait longer, or check the producer)",
                        op="wait_for_split", seconds=waited, setting="data.wait_timeout_s",
                    )  # fmt: skip
                if not logged:
                    log.info("waiting for %s (up to %.0f s)", marker, timeout)
                    logged = True
                time.sleep(min(self.data.poll_s, max(timeout - waited, 0.01)))
        return folders
