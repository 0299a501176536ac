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
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "ServeMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_ROW_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)


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

    def render(self) -> bytes:
        return generate_latest(self.registry)
