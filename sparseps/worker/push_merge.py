"""Adaptive push merging: hold a worker's pushes over a window of steps, send them as one.

Consecutive batches of CTR data repeat many keys (the frequent values of every slot), so
the pushes of W steps summed per key are far fewer rows than W pushes. A
:class:`PushMerger` holds the pushes a :class:`~sparseps.worker.pipeline.PushQueue`
takes, per ``(table, delta)``, and says when to send them: once ``window`` steps are
held, or once the first held push waited twice as long as the window should take at the
measured step interval (at least 50 ms), so a worker that stalls (a slow read, an
evaluation) does not sit on its updates. Sending merges each group with :func:`merge_pushes`: the keys' gradients, shows
and clicks summed, exactly what the client does with repeated keys of one push.

The window: ``Async(push_merge="on")`` holds ``push_merge_window`` steps;
``"auto"`` sizes it from what it measures, ``ceil(2 * push latency / step interval)``
steps (at most ``push_merge_window``): one merged push then keeps the servers busy with
this worker's pushes at most about half the time, and a server that answers faster than
the worker steps gets every step's push at once (window 1, no merging).

The trade-off is in the optimizer math: W steps of a key pushed as one apply one update
with the summed gradient (one Adagrad step with ``g1 + g2``, not two steps), and the rows
a pull reads lag by up to the window. ``bench/modes.py`` measures both sides (samples/s
and AUC); docs/training.md, "Push merging", has the figures.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..core.validate import check_int
from ..errors import ConfigError

__all__ = ["MERGE_MODES", "MergePolicy", "PushMerger", "merge_pushes"]

MERGE_MODES = ("off", "on", "auto")
MIN_DEADLINE_S = 0.05  # the shortest a held push may wait for its window to fill
_EMA = 0.2  # weight of a new measurement in the running means


@dataclass(frozen=True)
class MergePolicy:
    """How a push queue merges.

    Args:
        window: steps held before a send (``auto``: the most it may grow to).
        auto: size the window from measured push latency and step interval.
        deadline_s: seconds the first held push may wait before everything held is sent;
            None: twice the window's steps at the measured step interval, at least 50 ms.
    """

    window: int = 8
    auto: bool = True
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ConfigError(f"MergePolicy.window: expected an integer >= 1, got {self.window!r}")
        if self.deadline_s is not None and not (
            isinstance(self.deadline_s, int | float) and 0 < self.deadline_s < math.inf
        ):
            raise ConfigError(
                f"MergePolicy.deadline_s: expected seconds > 0, got {self.deadline_s!r}"
            )

    @classmethod
    def from_knobs(
        cls, owner: str, push_merge: str | None, window: int, default: MergePolicy | None = None
    ) -> MergePolicy | None:
        """A mode's ``push_merge`` / ``push_merge_window`` knobs as a policy, checked
        (``owner``, the mode, is named in the error): None keeps ``default``, ``"off"``
        merges nothing, ``"on"`` a fixed window, ``"auto"`` one sized by measurement."""
        if push_merge is not None and push_merge not in MERGE_MODES:
            raise ConfigError(
                f"{owner}.push_merge: expected None or one of {MERGE_MODES}, got {push_merge!r}"
            )
        check_int(owner, "push_merge_window", window, ge=1)
        if push_merge is None:
            return default
        if push_merge == "off":
            return None
        return cls(window=window, auto=push_merge == "auto")


def merge_pushes(parts: list[tuple]) -> tuple[np.ndarray, ...]:
    """Sum pushes ``[(keys, grads, shows, clicks)]`` of one table into one.

    ``shows`` / ``clicks`` may be None (a push's default: 1 show, 0 clicks per key).
    Returns ``(keys, grads, shows, clicks)``: the distinct keys (sorted), each key's
    gradients, shows and clicks summed in push order; pushing it applies what pushing
    every part in one request would (the client sums repeated keys the same way).
    """
    # here, not at the top: Strategy's MergePolicy is read by launchers and configs, which
    # then never import numba (~0.4 CPU-s a process)
    from ..core.keysets import unique_inverse
    from ..rpc.batching import merge_by_group

    keys = np.concatenate([np.asarray(p[0], np.uint64) for p in parts])
    grads = np.concatenate([np.asarray(p[1], np.float32) for p in parts])
    lengths = [len(p[0]) for p in parts]
    shows = _counts([p[2] for p in parts], lengths, 1.0)
    clicks = _counts([p[3] for p in parts], lengths, 0.0)
    distinct, inverse = unique_inverse(keys)
    merged, shows, clicks = merge_by_group(inverse, len(distinct), grads, shows, clicks)
    return distinct, merged, shows, clicks


def _counts(parts, lengths, fill: float) -> np.ndarray:
    return np.concatenate(
        [
            np.full(n, fill, np.float32) if p is None else np.asarray(p, np.float32)
            for p, n in zip(parts, lengths, strict=True)
        ]
    )


class PushMerger:
    """Pushes held for merging, and when to send them (used by the push queue's thread;
    :meth:`note_step` by the training thread).

    Args:
        policy: the :class:`MergePolicy`.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, policy: MergePolicy, *, clock=time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._groups: dict[tuple, list] = {}
        self._steps = 0  # held steps: pushes of the most-pushed group
        self._first: float | None = None  # when the oldest held push came
        self._latency: float | None = None  # running mean of one send's seconds
        self._interval: float | None = None  # running mean of seconds between steps
        self._last_step: float | None = None
        self._step_table: str | None = None
        self.held_rows = 0
        self.sent_rows = 0  # rows sent after merging, against held_rows before

    # -- measurements ------------------------------------------------------------------

    def note_step(self, table: str) -> None:
        """A push of ``table`` was put (the first table pushed marks the steps)."""
        if self._step_table is None:
            self._step_table = table
        if table != self._step_table:
            return
        now = self._clock()
        if self._last_step is not None:
            self._interval = _mean(self._interval, now - self._last_step)
        self._last_step = now

    def note_send(self, seconds: float) -> None:
        """One send (every group held, merged) took ``seconds`` until the servers answered."""
        self._latency = _mean(self._latency, seconds)

    @property
    def window(self) -> int:
        """Steps to hold before sending, now."""
        if not self.policy.auto:
            return self.policy.window
        if self._latency is None or not self._interval:
            return 1
        wanted = math.ceil(2.0 * self._latency / self._interval)
        return max(1, min(self.policy.window, wanted))

    # -- holding and sending -----------------------------------------------------------

    @property
    def holding(self) -> bool:
        return self._first is not None

    def add(self, item: tuple) -> None:
        """Hold ``(table, delta, keys, grads, shows, clicks)``."""
        if self._first is None:
            self._first = self._clock()
        group = self._groups.setdefault(item[:2], [])
        group.append(item[2:])
        self._steps = max(self._steps, len(group))
        self.held_rows += len(item[2])

    @property
    def deadline_s(self) -> float:
        """Seconds the first held push may wait, now."""
        if self.policy.deadline_s is not None:
            return self.policy.deadline_s
        return max(MIN_DEADLINE_S, 2.0 * self.window * (self._interval or 0.0))

    def time_left(self) -> float | None:
        """Seconds until the held pushes are due by deadline (None: nothing held)."""
        if self._first is None:
            return None
        return max(0.0, self._first + self.deadline_s - self._clock())

    def due(self) -> bool:
        """The window filled or the deadline passed."""
        return self._first is not None and (self._steps >= self.window or self.time_left() == 0.0)

    def take(self) -> list[tuple]:
        """Every held group merged: ``[(table, delta, keys, grads, shows, clicks)]``; the
        merger is empty afterwards."""
        out = []
        for (table, delta), parts in self._groups.items():
            merged = merge_pushes(parts) if len(parts) > 1 else _one(parts[0])
            self.sent_rows += len(merged[0])
            out.append((table, delta, *merged))
        self._groups, self._steps, self._first = {}, 0, None
        return out


def _one(part: tuple) -> tuple:
    return tuple(part)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1.0 - _EMA) * old + _EMA * new
