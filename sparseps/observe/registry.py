"""The Prometheus metric families of every role, and the endpoint that serves them.

One registry per process (:func:`registry`), holding the families of the roles that run in
it and the process collector (``process_resident_memory_bytes``, CPU seconds, open fds).
Families are made on first use, never at import time.

Servers (recorded once per request at the request loop's dispatch point, never per key):

- ``sparseps_server_op_seconds{op}``: a latency histogram per op (its ``_count`` is the
  op count; ops/s is its rate);
- ``sparseps_server_errors_total{kind}``: ``bad_message``, ``refused``, ``failed``, ``bug``;
- ``sparseps_server_queue_depth``: requests waiting for a pool thread;
- ``sparseps_server_table_rows{table}``, ``sparseps_server_table_bytes{table}``,
  ``sparseps_server_peak_rss_bytes``: read from the server's stats when scraped.

Workers: ``sparseps_worker_samples_total``, ``sparseps_worker_batches_total``,
``sparseps_worker_step_seconds_total{phase}`` (read, pull, compute, push, wait),
``sparseps_worker_staleness_pushes`` (gradient batches queued but not yet sent when the
last step ended), ``sparseps_worker_pass_auc{phase}``, ``sparseps_worker_pass_logloss{phase}``,
``sparseps_worker_pass{phase}`` (the last pass reported), ``sparseps_online_pass_seq``.

Launcher: ``sparseps_launcher_role_up{role,rank}`` (1 running, 0 exited),
``sparseps_launcher_restarts_total``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

__all__ = [
    "LauncherMetrics",
    "ServerMetrics",
    "WorkerMetrics",
    "launcher_metrics",
    "online_pass",
    "registry",
    "serve_metrics",
    "server_metrics",
    "stop_serving_metrics",
    "worker_metrics",
]

STEP_PHASES = ("read", "pull", "compute", "push", "wait")
# Server op latencies: data-plane ops take 0.1-10 ms, saves and loads seconds.
_OP_BUCKETS = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


@cache
def registry() -> CollectorRegistry:
    """This process's registry (with the process collector: memory, CPU, fds)."""
    reg = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=reg)
    return reg


_serving: dict[str, Any] = {}
_serve_lock = threading.Lock()


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` of this process on ``host:port`` (a daemon thread); idempotent.

    Returns:
        the port served.
    """
    from prometheus_client import start_http_server

    with _serve_lock:
        if "server" in _serving:
            return int(_serving["server"].server_port)
        server, thread = start_http_server(port, addr=host, registry=registry())
        _serving.update(server=server, thread=thread)
        return int(server.server_port)


def stop_serving_metrics() -> None:
    """Stop the endpoint :func:`serve_metrics` started (tests; processes just exit)."""
    with _serve_lock:
        server, thread = _serving.pop("server", None), _serving.pop("thread", None)
    if server is not None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2.0)


@dataclass(frozen=True)
class ServerMetrics:
    op_seconds: Histogram
    errors: Counter
    queue_depth: Gauge

    # op -> its histogram child: labels() takes a lock and builds a key on every call
    _by_op: dict = field(default_factory=dict, compare=False)

    def observe_op(self, op: str, seconds: float) -> None:
        child = self._by_op.get(op)
        if child is None:
            child = self._by_op[op] = self.op_seconds.labels(op)
        child.observe(seconds)

    def error(self, kind: str) -> None:
        self.errors.labels(kind).inc()


class _TablesCollector:
    """Rows and bytes per table, read from a server's stats at scrape time."""

    def __init__(self) -> None:
        self.stats: Callable[[], dict] | None = None

    def collect(self):
        rows = GaugeMetricFamily(
            "sparseps_server_table_rows",
            "live rows of a sparse table on this server",
            labels=["table"],
        )
        size = GaugeMetricFamily(
            "sparseps_server_table_bytes",
            "memory bytes of a sparse table on this server",
            labels=["table"],
        )
        peak = GaugeMetricFamily(
            "sparseps_server_peak_rss_bytes", "peak resident memory of the server"
        )
        stats = self.stats() if self.stats is not None else None
        if stats is not None:
            for name, table in sorted(stats.get("tables", {}).items()):
                rows.add_metric([name], float(table.get("rows", 0)))
                size.add_metric([name], float(table.get("bytes_used", 0)))
            peak.add_metric([], float(stats.get("peak_rss_bytes", 0)))
        return [rows, size, peak]

    def describe(self):
        return []


_tables = _TablesCollector()


@cache
def server_metrics() -> ServerMetrics:
    reg = registry()
    reg.register(_tables)
    return ServerMetrics(
        op_seconds=Histogram(
            "sparseps_server_op_seconds",
            "time to answer one request, by op",
            ["op"],
            buckets=_OP_BUCKETS,
            registry=reg,
        ),  # fmt: skip
        errors=Counter(
            "sparseps_server_errors",
            "requests answered with an error, by kind",
            ["kind"],
            registry=reg,
        ),  # fmt: skip
        queue_depth=Gauge(
            "sparseps_server_queue_depth", "requests waiting for a pool thread", registry=reg
        ),
    )


def watch_server(stats: Callable[[], dict], queue_depth: Callable[[], float]) -> ServerMetrics:
    """Register a server's stats (table rows and bytes) and queue depth; returns its families."""
    metrics = server_metrics()
    _tables.stats = stats
    metrics.queue_depth.set_function(queue_depth)
    return metrics


@dataclass(frozen=True)
class WorkerMetrics:
    samples: Counter
    batches: Counter
    step_seconds: Counter
    staleness: Gauge
    pass_auc: Gauge
    pass_logloss: Gauge
    pass_id: Gauge

    def pass_done(self, pass_id: int, phase: str, auc: float, logloss: float) -> None:
        self.pass_auc.labels(phase).set(auc)
        self.pass_logloss.labels(phase).set(logloss)
        self.pass_id.labels(phase).set(pass_id)


@cache
def worker_metrics() -> WorkerMetrics:
    reg = registry()
    step = Counter(
        "sparseps_worker_step_seconds", "seconds of training steps, by phase", ["phase"],
        registry=reg,
    )  # fmt: skip
    for phase in STEP_PHASES:
        step.labels(phase)
    return WorkerMetrics(
        samples=Counter("sparseps_worker_samples", "samples trained", registry=reg),
        batches=Counter("sparseps_worker_batches", "batches trained", registry=reg),
        step_seconds=step,
        staleness=Gauge(
            "sparseps_worker_staleness_pushes",
            "gradient batches queued for the servers but not sent yet (async mode)",
            registry=reg,
        ),
        pass_auc=Gauge(
            "sparseps_worker_pass_auc", "global AUC of the last pass", ["phase"], registry=reg
        ),
        pass_logloss=Gauge(
            "sparseps_worker_pass_logloss",
            "global logloss of the last pass",
            ["phase"],
            registry=reg,
        ),
        pass_id=Gauge(
            "sparseps_worker_pass", "number of the last pass reported", ["phase"], registry=reg
        ),
    )


@cache
def online_pass() -> Gauge:
    """``sparseps_online_pass_seq``: made only by an online job (absent elsewhere)."""
    return Gauge(
        "sparseps_online_pass_seq",
        "sequence number of the online pass running",
        registry=registry(),
    )


@dataclass(frozen=True)
class LauncherMetrics:
    role_up: Gauge
    restarts: Counter


@cache
def launcher_metrics() -> LauncherMetrics:
    reg = registry()
    return LauncherMetrics(
        role_up=Gauge(
            "sparseps_launcher_role_up",
            "1 while a role's process runs, 0 once it exited",
            ["role", "rank"],
            registry=reg,
        ),  # fmt: skip
        restarts=Counter(
            "sparseps_launcher_restarts", "worker group restarts of this job", registry=reg
        ),
    )
