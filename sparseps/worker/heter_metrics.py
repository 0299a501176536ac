"""A heter worker's Prometheus families (its ``/metrics``, read by the status page).

- ``sparseps_heter_requests_total``: ``heter_step`` requests served (trainer steps);
- ``sparseps_heter_device_batches_total``, ``sparseps_heter_rows_total``: device batches
  run and the rows in them (rows / batches: the mean device batch);
- ``sparseps_heter_busy_seconds_total``, ``sparseps_heter_idle_seconds_total``: time spent
  serving and waiting for requests (idle counts from the first request on);
- ``sparseps_heter_utilisation``: the busy fraction of the last :data:`WINDOW_S` seconds
  or so (the device batches that ended in them), the figure to watch: near 1 the heter
  worker is the bottleneck (add heter workers or a faster device), low it waits on its
  trainers (add trainers).

Families are made on first use (a heter worker's service), never at import time.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from functools import cache

from prometheus_client import Counter, Gauge

from ..observe.registry import registry

__all__ = ["WINDOW_S", "HeterMetrics", "heter_metrics"]

WINDOW_S = 10.0


@dataclass
class HeterMetrics:
    requests: Counter
    device_batches: Counter
    rows: Counter
    busy_seconds: Counter
    idle_seconds: Counter
    utilisation: Gauge
    # (end time, busy s, idle s) of the recent device batches, for the utilisation gauge
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=4096))

    def batch_done(self, requests: int, rows: int, busy_s: float, idle_s: float) -> None:
        """One device batch of ``requests`` steps and ``rows`` rows, and the idle time
        before it."""
        self.requests.inc(requests)
        self.device_batches.inc()
        self.rows.inc(rows)
        self.busy_seconds.inc(busy_s)
        self.idle_seconds.inc(idle_s)
        now = time.monotonic()
        self.recent.append((now, busy_s, idle_s))
        while self.recent and self.recent[0][0] < now - WINDOW_S:
            self.recent.popleft()
        busy = sum(b for _, b, _ in self.recent)
        idle = sum(i for _, _, i in self.recent)
        self.utilisation.set(busy / max(busy + idle, 1e-9))


@cache
def heter_metrics() -> HeterMetrics:
    reg = registry()
    return HeterMetrics(
        requests=Counter("sparseps_heter_requests", "heter_step requests served", registry=reg),
        device_batches=Counter(
            "sparseps_heter_device_batches",
            "device batches run (gathered requests)",
            registry=reg,
        ),  # fmt: skip
        rows=Counter("sparseps_heter_rows", "rows of the device batches", registry=reg),
        busy_seconds=Counter(
            "sparseps_heter_busy_seconds", "seconds serving requests", registry=reg
        ),
        idle_seconds=Counter(
            "sparseps_heter_idle_seconds", "seconds waiting for requests", registry=reg
        ),
        utilisation=Gauge(
            "sparseps_heter_utilisation",
            f"busy fraction of the heter worker over the last {WINDOW_S:g} s",
            registry=reg,
        ),
    )
