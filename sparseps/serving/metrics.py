"""``ServeMetrics``: the Prometheus metrics of one service, in its own registry.

``GET /metrics`` renders (names as Prometheus writes them)::

    sparseps_serve_requests_total{route, status}     requests answered
    sparseps_serve_request_seconds{route}            latency histogram (request read to answer)
    sparseps_serve_rows_total                        rows predicted
    sparseps_serve_request_rows                      rows per /predict request (histogram)
    sparseps_serve_reloads_total{outcome}            saves applied / refused
    sparseps_serve_model_age_seconds                 now - when the served last save was written
    sparseps_serve_model_sequence                    sequence number of the served last save

A registry per service (not the process-wide default) keeps two services in one
process, as in tests, apart.

Under ``sparseps serve --workers N`` a scrape reaches one worker, so each worker writes
its own metrics next to the workers' board every :data:`SHARE_S` seconds
(:meth:`ServeMetrics.share`) and any worker answers ``GET /metrics`` with every worker's,
each sample labelled ``worker="I"`` (its own read at the scrape, the others' at most
``SHARE_S`` old; a worker not started yet is left out). Sum over ``worker`` for the
service's totals; a restarted worker's counters start again from 0, as Prometheus
expects of a restarted process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ..core.atomic_file import replaced_atomically

__all__ = ["CONTENT_TYPE", "ServeMetrics"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_ROW_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
# How often a worker of ``--workers N`` writes its metrics for the others to answer with.
SHARE_S = 1.0


class ServeMetrics:
    """Counters and histograms of one service (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "sparseps_serve_requests", "Requests answered", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "sparseps_serve_request_seconds",
            "Seconds from reading a request to answering it",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rows = Counter("sparseps_serve_rows", "Rows predicted", registry=r)
        self.request_rows = Histogram(
            "sparseps_serve_request_rows",
            "Rows per predict request",
            buckets=_ROW_BUCKETS,
            registry=r,
        )
        self.reloads = Counter(
            "sparseps_serve_reloads", "Inference saves applied or refused", ["outcome"], registry=r
        )
        self.model_age = Gauge(
            "sparseps_serve_model_age_seconds",
            "Seconds since the served model's last save was written",
            registry=r,
        )
        self.model_sequence = Gauge(
            "sparseps_serve_model_sequence", "Sequence number of the served last save", registry=r
        )
        for outcome in ("applied", "refused"):
            self.reloads.labels(outcome)  # present (at 0) before the first reload
        self._children: dict[tuple[str, int], tuple] = {}
        self._shared: tuple[Path, int, int] | None = None  # (folder, index, workers)

    def follow(self, created_at: Callable[[], float], sequence: Callable[[], int]) -> None:
        """Read the served model's creation time and sequence at each scrape."""
        self.model_age.set_function(lambda: max(0.0, time.time() - created_at()))
        self.model_sequence.set_function(lambda: float(sequence()))

    def observe(self, route: str, status: int, seconds: float, rows: int = 0) -> None:
        children = self._children.get((route, status))
        if children is None:  # a label lookup per request cost as much as the rest here
            children = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._children[route, status] = children
        children[0].inc()
        children[1].observe(seconds)
        if rows:
            self.rows.inc(rows)
            self.request_rows.observe(rows)

    def on_reload(self, outcome: str, name: str, error: str | None) -> None:
        self.reloads.labels(outcome).inc()

    def share(self, folder: Path, index: int, workers: int) -> None:
        """Worker ``index`` of ``workers``: write this worker's metrics to ``folder`` every
        :data:`SHARE_S` (a daemon thread, for the process's life) and render every
        worker's from there (module docstring)."""
        self._shared = (Path(folder), index, workers)
        threading.Thread(target=self._write_shared, name="serve-metrics", daemon=True).start()

    def render(self) -> bytes:
        own = generate_latest(self.registry)
        if self._shared is None:
            return own
        folder, index, workers = self._shared
        texts = {index: own.decode()}
        for other in range(workers):
            if other != index:
                with contextlib.suppress(FileNotFoundError):  # not started yet
                    texts[other] = _shared_file(folder, other).read_text()
        return generate_latest(_Labelled(texts))

    def _write_shared(self) -> None:
        assert self._shared is not None
        folder, index, _ = self._shared
        failing = False
        while True:
            try:
                with replaced_atomically(_shared_file(folder, index)) as tmp:
                    tmp.write_bytes(generate_latest(self.registry))
                failing = False
            except OSError as exc:  # the others show this worker's last write meanwhile
                if not failing:
                    log.warning("cannot write this worker's metrics for the others: %s", exc)
                failing = True
            time.sleep(SHARE_S)


def _shared_file(folder: Path, index: int) -> Path:
    return folder / f"metrics.{index}.prom"


class _Labelled:
    """Several workers' metrics (Prometheus text by worker index) as one collector: each
    family once, each sample with its ``worker`` label."""

    def __init__(self, texts: dict[int, str]) -> None:
        self._texts = texts

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for index, text in sorted(self._texts.items()):
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(
                    Sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp)
                    for s in family.samples
                )
        return list(families.values())
