"""Bounded staleness for async mode: ``Strategy(mode="async", max_staleness=K)``.

A worker may run at most K steps ahead of the slowest worker. Each worker publishes how
many steps of the pass it has completed on the workers' rendezvous store (one ``set`` per
step: the only per-step round trip) and, before starting step ``s``, makes sure that
``s - min(others' completed steps) <= K``, waiting (polling the store) while it is not.
A worker whose data ran out publishes "infinitely far" so the others never wait for it.

**Staleness**, as measured and reported: when a worker starts a step, the number of steps
it has completed this pass minus the fewest any other worker had published (0 when it is
not ahead). Published counts can only lag the truth, so the figure is an upper bound of
the true lead, and the bound is kept on it: the true lead never exceeds K either. The
others' counts are read when the bound might be hit and every ``REFRESH`` steps (so the
figure stays meaningful with a loose bound); each read is one ``get`` per other worker.

Per pass, :meth:`BoundedAsyncMode.timings` reports ``staleness_max``,
``staleness_mean``, ``staleness_wait_s`` (time spent held back by the bound) and
``staleness_store_s`` (time in store round trips: the overhead against plain async).
"""

from __future__ import annotations

import itertools
import logging
import time

from ..core import collectives, worker_store
from ..errors import DeadlineError
from .modes import AsyncMode

__all__ = ["REFRESH", "BoundedAsyncMode", "StalenessGate"]

log = logging.getLogger(__name__)

REFRESH = 8  # read the others' counts at least every this many steps
_DONE = 1 << 62  # what a worker whose data ran out publishes
_SETTING = "Strategy.collective_timeout"
# every worker builds its modes in the same order: the n-th one of each process shares keys
_instances = itertools.count()


class StalenessGate:
    """Holds a worker back while it is more than ``bound`` steps ahead of the slowest.

    Args:
        store: the workers' rendezvous store (``set``/``get`` of bytes).
        rank, world: this worker's rank and the worker count.
        bound: K, the most steps this worker may be ahead.
        timeout: seconds it may wait for the others before raising ``DeadlineError``.
    """

    def __init__(self, store, rank: int, world: int, bound: int, timeout: float) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.bound, self.timeout = bound, timeout
        self._job = f"sparseps/staleness/{next(_instances)}"
        self._prefix = f"{self._job}/0"
        self.done = 0  # steps completed this pass
        self._min_seen = 0
        self._since_read = 0
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.stale_max = 0
        self.stale_sum = 0
        self.steps = 0
        self.wait_s = 0.0
        self.store_s = 0.0

    def _key(self, rank: int) -> str:
        return f"{self._prefix}/{rank}"

    def _publish(self, value: int) -> None:
        start = time.perf_counter()
        self.store.set(self._key(self.rank), str(value))
        self.store_s += time.perf_counter() - start

    def _read_min(self) -> int:
        start = time.perf_counter()
        seen = [int(self.store.get(self._key(r))) for r in range(self.world) if r != self.rank]
        self.store_s += time.perf_counter() - start
        self._since_read = 0
        return min(seen)

    def begin_pass(self, index: int) -> None:
        self._prefix = f"{self._job}/{index}"
        self.done, self._min_seen, self._since_read = 0, 0, 0
        self._publish(0)

    def before_step(self) -> None:
        """Wait until starting step ``done`` keeps this worker within the bound."""
        s = self.done
        if s - self._min_seen > self.bound or self._since_read >= REFRESH:
            self._min_seen = self._read_min()
        if s - self._min_seen > self.bound:
            start = time.perf_counter()
            pause = 0.001
            while s - self._min_seen > self.bound:
                waited = time.perf_counter() - start
                if waited > self.timeout:
                    raise DeadlineError(
                        f"worker {self.rank}: waited {waited:.1f} s for the slowest worker to "
                        f"reach step {s - self.bound} (max_staleness={self.bound}, this worker "
                        f"is at step {s}); check the other workers' logs, or raise {_SETTING}",
                        op="max_staleness wait", role="worker", seconds=waited, setting=_SETTING,
                    )  # fmt: skip
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                self._min_seen = self._read_min()
            self.wait_s += time.perf_counter() - start
        lead = max(0, s - self._min_seen)
        self.stale_max = max(self.stale_max, lead)
        self.stale_sum += lead
        self.steps += 1
        self._since_read += 1

    def after_step(self) -> None:
        self.done += 1
        self._publish(self.done)

    def finish(self) -> None:
        """This worker's data ran out: never hold the others back again this pass."""
        self._publish(_DONE)

    def timings(self) -> dict:
        out = {
            "staleness_max": self.stale_max,
            "staleness_mean": round(self.stale_sum / max(self.steps, 1), 3),
            "staleness_wait_s": round(self.wait_s, 4),
            "staleness_store_s": round(self.store_s, 4),
        }
        self._reset_stats()
        return out


class BoundedAsyncMode(AsyncMode):
    """Async mode with a worker at most ``Strategy.max_staleness`` steps ahead of the
    slowest (see the module docstring); selected by ``mode="async"`` with a bound."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        store, world = worker_store.current(), collectives.world_size()
        self.gate = (
            StalenessGate(
                store, self.rank, world, self.config.max_staleness, self.collective_timeout
            )
            if store is not None and world > 1
            else None
        )

    def begin_pass(self, dataset, lookups, index: int) -> None:
        super().begin_pass(dataset, lookups, index)
        if self.gate is not None:
            self.gate.begin_pass(index)

    def steps(self, source):
        if self.gate is None:
            yield from source
            return
        for item in source:
            self.gate.before_step()
            yield item
        self.gate.finish()

    def apply(self, grads: list, dense_grad) -> None:
        super().apply(grads, dense_grad)
        if self.gate is not None:
            self.gate.after_step()

    def timings(self) -> dict:
        out = super().timings()
        if self.gate is not None:
            out.update(self.gate.timings())
            log.info(
                "staleness this pass: max %d, mean %.2f (bound %d), held back %.3f s",
                out["staleness_max"], out["staleness_mean"], self.gate.bound,
                out["staleness_wait_s"],
            )  # fmt: skip
        return out
