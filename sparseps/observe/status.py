"""The job status page the launcher serves (``sparseps launch --status-port P``).

A sampler thread scrapes every live role's ``/metrics`` once a second and keeps a
bounded history; a small HTTP server (stdlib, a daemon thread) serves:

- ``/``: the page (``static/status.html`` + ``status.js`` + ``status.css``, shipped in the
  package: it works offline, no CDN); it polls ``/api/status`` and redraws itself;
- ``/api/status``: JSON with the roles (liveness, pid, attempt, exit code, the last line
  of each log), the history of samples/s and of the last pass's AUC, rows and bytes per
  table and server, and the running pass of an online job;
- ``/metrics``: the launcher's own metrics.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path

__all__ = ["StatusServer", "last_line", "scrape"]

log = logging.getLogger(__name__)

_STATIC = {
    "/": ("status.html", "text/html; charset=utf-8"),
    "/status.html": ("status.html", "text/html; charset=utf-8"),
    "/static/status.js": ("status.js", "application/javascript; charset=utf-8"),
    "/static/status.css": ("status.css", "text/css; charset=utf-8"),
}
HISTORY = 3600  # samples kept (an hour at one a second)


def last_line(path: str | Path, limit: int = 8192) -> str:
    """The last non-empty line of a log file ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    lines = [line for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""  # the page cuts it to its width


def scrape(host: str, port: int, timeout_s: float = 0.5) -> dict[str, list[tuple[dict, float]]]:
    """``{sample name: [(labels, value), ...]}`` of one ``/metrics`` endpoint."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as reply:
        return parse_exposition(reply.read().decode())


def parse_exposition(text: str) -> dict[str, list[tuple[dict, float]]]:
    """``{sample name: [(labels, value), ...]}`` of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict, float]]] = collections.defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((dict(sample.labels), float(sample.value)))
    return out


def _value(metrics: dict, name: str, **labels: str) -> float | None:
    for found, value in metrics.get(name, ()):
        if all(found.get(k) == v for k, v in labels.items()):
            return value
    return None


def _heter_worker(metrics: dict) -> dict:
    """A heter worker's utilisation and mean device batch (rows, requests) from its metrics."""
    batches = _value(metrics, "sparseps_heter_device_batches_total") or 0.0
    rows = _value(metrics, "sparseps_heter_rows_total") or 0.0
    requests = _value(metrics, "sparseps_heter_requests_total") or 0.0
    return {
        "utilisation": _value(metrics, "sparseps_heter_utilisation"),
        "mean_batch_rows": rows / batches if batches else None,
        "mean_batch_requests": requests / batches if batches else None,
    }


class StatusServer:
    """Serve the status page of a job; a context manager.

    Args:
        roles: returns the roles as :meth:`sparseps.launch.supervisor.Supervisor.roles` does.
        job_id: shown in the title.
        host, port: where to serve (port 0: a free one; :attr:`port` says which).
        metrics_host: where the roles serve their ``/metrics``.
        interval_s: seconds between scrapes.
    """

    def __init__(
        self,
        roles: Callable[[], list[dict]],
        *,
        job_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        metrics_host: str = "127.0.0.1",
        interval_s: float = 1.0,
    ) -> None:
        self.roles = roles
        self.job_id = job_id
        self.metrics_host = metrics_host
        self.interval_s = interval_s
        self._lock = threading.Lock()
        # one sample at a time: a sample's time and the counters it read must not
        # interleave with another's (the sampler thread against a caller's sample)
        self._sampling = threading.Lock()
        self._series: collections.deque[dict] = collections.deque(maxlen=HISTORY)
        self._tables: dict[str, dict] = {}
        self._online: dict = {}
        self._heter: dict[str, dict] = {}  # per heter worker: utilisation, mean device batch
        self._last_samples: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._http = ThreadingHTTPServer((host, port), self._handler())
        self._http.daemon_threads = True
        self.port = int(self._http.server_address[1])
        self._threads = [
            threading.Thread(target=self._http.serve_forever, name="sparseps-status", daemon=True),
            threading.Thread(target=self._sample_loop, name="sparseps-status-sampler", daemon=True),
        ]

    def start(self) -> StatusServer:
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        """Stop serving and sampling; idempotent, also when never started."""
        self._stop.set()
        if self._threads[0].is_alive():
            self._http.shutdown()  # waits for serve_forever: only once it runs
        self._http.server_close()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=2.0)

    def __enter__(self) -> StatusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sampling ----------------------------------------------------------------------

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # the page shows stale data rather than dying
                log.debug("status sampler: %s", exc)
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        """Scrape every live role once and add a point to the history."""
        with self._sampling:
            self._sample()

    def _sample(self) -> None:
        now = time.time()
        samples = 0.0
        auc: dict[str, float] = {}
        tables: dict[str, dict] = {}
        online: dict = {}
        heter: dict[str, dict] = {}
        for role in self.roles():
            port = role.get("metrics_port")
            if not role.get("alive") or not port:
                continue
            try:
                metrics = scrape(self.metrics_host, int(port))
            except OSError:
                continue
            if role["role"] == "worker":
                samples += _value(metrics, "sparseps_worker_samples_total") or 0.0
                for phase in ("train", "test"):
                    value = _value(metrics, "sparseps_worker_pass_auc", phase=phase)
                    if value is not None and role["rank"] == 0:
                        auc[phase] = value
                seq = _value(metrics, "sparseps_online_pass_seq")
                if seq is not None and role["rank"] == 0:
                    online = {"pass_seq": int(seq)}
            elif role["role"] == "heter_worker":
                heter[str(role["rank"])] = _heter_worker(metrics)
            else:
                tables[str(role["rank"])] = {
                    labels["table"]: {
                        "rows": value,
                        "bytes": _value(metrics, "sparseps_server_table_bytes", **labels),
                    }
                    for labels, value in metrics.get("sparseps_server_table_rows", ())
                }
        with self._lock:
            rate = None
            if self._last_samples is not None:
                then, before = self._last_samples
                if now > then and samples >= before:
                    rate = (samples - before) / (now - then)
            self._last_samples = (now, samples)
            if rate is not None:
                self._series.append({"t": now, "samples_per_s": rate, "samples": samples, **auc})
            self._tables = tables or self._tables
            self._online = online or self._online
            self._heter = heter or self._heter

    def status(self) -> dict:
        """What ``/api/status`` answers."""
        roles = []
        for role in self.roles():
            roles.append(
                {
                    **{k: role.get(k) for k in ("role", "rank", "pid", "attempt", "alive")},
                    "exit_code": role.get("exit_code"),
                    "last_line": last_line(role["log_path"]) if role.get("log_path") else "",
                }
            )
        with self._lock:
            return {
                "job_id": self.job_id,
                "time": time.time(),
                "roles": roles,
                "series": list(self._series),
                "tables": self._tables,
                "online": self._online,
                "heter_workers": self._heter,
            }

    # -- HTTP --------------------------------------------------------------------------

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                path = self.path.split("?", 1)[0]
                if path == "/api/status":
                    body, kind = json.dumps(server.status()).encode(), "application/json"
                elif path == "/metrics":
                    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                    from .registry import registry

                    body, kind = generate_latest(registry()), CONTENT_TYPE_LATEST
                elif path in _STATIC:
                    name, kind = _STATIC[path]
                    body = resources.files(__package__).joinpath("static", name).read_bytes()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                log.debug("status page: " + format, *args)

        return Handler
