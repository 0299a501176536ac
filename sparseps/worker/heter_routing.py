"""Which heter worker takes a trainer's next step: the one that will answer it first, by
the throughput the trainer measures.

A job may mix devices (``--heter-device cuda,cpu``) and its heter workers serve different
numbers of trainers, so a fixed ``rank % H`` would leave the fast ones waiting on the slow.
Each trainer keeps, per heter worker, the seconds per row of its device batches (each
answer says how long the device batch it ran in took and how many rows it held; an
exponential average) and the rows it has in flight there, and sends each step where
``(rows in flight + rows) x seconds per row`` is least. A heter worker not measured yet is tried once first (its own heter
worker, ``rank % H``, before the others), so every one is measured early; a step lost with
a heter worker that died counts as a slow measurement. Async heter mode only: heter in
sync mode sends step ``i`` of every trainer to one heter worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HeterRouter"]

SMOOTHING = 0.2  # weight of the newest measurement in the average


@dataclass
class HeterRouter:
    """Per-trainer routing of steps over ``count`` heter workers (see the module).

    Attributes:
        count: heter workers.
        home: the one to try first (``rank % count``).
        seconds_per_row: measured, per heter worker (None: not yet).
        in_flight: rows sent and not answered, per heter worker.
        steps: steps sent to each heter worker.
    """

    count: int
    home: int = 0
    seconds_per_row: list[float | None] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seconds_per_row = [None] * self.count
        self.in_flight = [0] * self.count
        self.steps = [0] * self.count

    def pick(self, rows: int) -> int:
        """The heter worker of a step of ``rows`` rows (counted in flight there)."""
        order = [(self.home + i) % self.count for i in range(self.count)]
        unmeasured = [h for h in order if self.seconds_per_row[h] is None]
        idle = [h for h in unmeasured if not self.in_flight[h]]
        if idle:
            chosen = idle[0]
        elif len(unmeasured) == self.count:
            chosen = self.home
        else:
            chosen = min(
                (h for h in order if self.seconds_per_row[h] is not None),
                key=lambda h: (self.in_flight[h] + rows) * (self.seconds_per_row[h] or 0.0),
            )
        self.in_flight[chosen] += rows
        self.steps[chosen] += 1
        return chosen

    def done(self, heter: int, rows: int, seconds: float, batch_rows: int) -> None:
        """A step of ``rows`` rows at ``heter`` answered; it ran in a device batch of
        ``batch_rows`` rows that took ``seconds``."""
        self.in_flight[heter] = max(0, self.in_flight[heter] - rows)
        measured = seconds / max(batch_rows, 1)
        before = self.seconds_per_row[heter]
        self.seconds_per_row[heter] = (
            measured if before is None else (1 - SMOOTHING) * before + SMOOTHING * measured
        )

    def lost(self, heter: int, rows: int) -> None:
        """A step at ``heter`` was lost with it: out of flight, measured as very slow
        until the restarted process answers a step."""
        self.in_flight[heter] = max(0, self.in_flight[heter] - rows)
        known = [s for s in self.seconds_per_row if s is not None]
        self.seconds_per_row[heter] = 10 * max(known, default=1.0)
