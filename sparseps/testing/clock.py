"""A clock a test moves by hand, for code that takes ``clock=`` (monotonic seconds)."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """Callable like ``time.monotonic``; time moves only by :meth:`advance` (or ``now +=``),
    so a test of a deadline or a rate states exactly when each event happens."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0: a monotonic clock never goes back); the new time."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock does not go back ({seconds} s)")
        self.now += seconds
        return self.now
