"""``sparseps serve`` under load: rows/s and p50/p99 latency against the in-process Predictor.

Records (``sparseps bench serve [--quick] [--json]``), for requests of 1, 64 and 512 rows
at 1, 4 and 16 concurrent clients (quick: 1 and 4):

- ``serve_rows_per_s``: rows answered per second by a ``sparseps serve`` child process
  (uvicorn, JSON rows in the Criteo schema; ``body=arrow``: the same rows as an Arrow
  stream, 512 rows). Baseline: ``Predictor.predict_batch`` in this process on the same
  rows, already a ``Batch`` (no HTTP, no parsing), one call after another. Both use one
  torch intra-op thread (the service's default ``--torch-threads 1``).
- ``serve_p50_ms`` / ``serve_p99_ms``: latency of one request as the client sees it
  (connection kept alive). Baseline: the Predictor call's p50 / p99.

The model is what ``sparseps demo --rows N`` trains and saves (wide&deep, 26 slots, dim 8,
hidden 400-400-400); request rows are its test rows. Clients are threads of this process
(httpx), so on a small machine they compete with the service for the same cores; the
figures are of the whole loop, client included. Each cell runs ``SECONDS`` after a warm-up.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from sparseps.benchmarking import BenchRecord

SIZES = (1, 64, 512)
CONCURRENCY = (1, 4, 16)
QUICK_CONCURRENCY = (1, 4)
SECONDS, QUICK_SECONDS = 3.0, 0.4
DEMO_ROWS, QUICK_DEMO_ROWS = 50_000, 4_000
MIN_REQUESTS = 5
ARROW = "application/vnd.apache.arrow.stream"


def _model(work: Path, rows: int) -> tuple[Path, Path]:
    """Train and save a model with ``sparseps demo``; returns (inference dir, test file)."""
    done = subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "demo", "--rows", str(rows), "--out",
         str(work / "demo"), "--json"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"sparseps demo failed:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    test = Path(summary["test_data"])
    test_file = test if test.is_file() else sorted(p for p in test.iterdir() if p.is_file())[0]
    return Path(summary["inference_model"]), test_file


def _arrow_body(rows: list[dict]) -> bytes:
    import pyarrow as pa

    table = pa.Table.from_struct_array(pa.array(rows))
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _load(
    url: str, body: bytes, content_type: str, clients: int, seconds: float
) -> tuple[list[float], float]:
    """Latencies (s) of every request ``clients`` threads sent in about ``seconds`` (each
    at least ``MIN_REQUESTS``, timed after every client connected and warmed up), and the
    wall time of that window."""
    import httpx

    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures: list[str] = []
    ready = threading.Barrier(clients + 1)
    window = {"start": 0.0, "end": 0.0}

    def client(mine: list[float]) -> None:
        headers = {"content-type": content_type}
        with httpx.Client(base_url=url, timeout=60) as c:
            c.post("/predict", content=body, headers=headers)  # connect + warm
            ready.wait(120)
            ready.wait(120)
            while time.perf_counter() - window["start"] < seconds or len(mine) < MIN_REQUESTS:
                start = time.perf_counter()
                got = c.post("/predict", content=body, headers=headers)
                mine.append(time.perf_counter() - start)
                if got.status_code != 200:
                    failures.append(got.text[:200])
            window["end"] = max(window["end"], time.perf_counter())

    threads = [threading.Thread(target=client, args=(m,)) for m in latencies]
    for t in threads:
        t.start()
    ready.wait(120)  # every client warmed up
    window["start"] = time.perf_counter()
    ready.wait(120)  # go
    for t in threads:
        t.join(seconds + 300)
    if failures:
        raise RuntimeError(f"{len(failures)} failed requests, first: {failures[0]}")
    return [x for mine in latencies for x in mine], window["end"] - window["start"]


def _predictor_times(predictor, batch, seconds: float) -> list[float]:
    predictor.predict_batch(batch)
    times = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop or len(times) < MIN_REQUESTS:
        start = time.perf_counter()
        predictor.predict_batch(batch)
        times.append(time.perf_counter() - start)
    return times


def _records(
    rows: int, clients: int, body: str, load: tuple[list[float], float], base: list[float]
) -> list[BenchRecord]:
    served, wall = load
    params = {"rows": rows, "concurrency": clients, "body": body, "requests": len(served)}
    p = lambda xs, q: float(np.percentile(xs, q)) * 1e3  # noqa: E731
    return [
        BenchRecord("serve_rows_per_s", rows * len(served) / wall, "rows/s",
                    rows * len(base) / sum(base), params),
        BenchRecord("serve_p50_ms", p(served, 50), "ms", p(base, 50), params),
        BenchRecord("serve_p99_ms", p(served, 99), "ms", p(base, 99), params),
    ]  # fmt: skip


def run(quick: bool = False) -> list[BenchRecord]:
    import torch

    from sparseps.checkpoint.predictor import Predictor
    from sparseps.data import CRITEO
    from sparseps.serving import ServeProcess
    from sparseps.serving.requests import batch_from_body, criteo_request_rows

    torch.set_num_threads(1)  # as the service (ServeConfig.torch_threads)
    seconds = QUICK_SECONDS if quick else SECONDS
    levels = QUICK_CONCURRENCY if quick else CONCURRENCY
    records: list[BenchRecord] = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        model, test_file = _model(Path(tmp), QUICK_DEMO_ROWS if quick else DEMO_ROWS)
        predictor = Predictor(model)
        all_rows = criteo_request_rows(test_file, max(SIZES))
        with ServeProcess(model, poll_s=5.0) as service:
            cells = [(n, c, "json") for n in SIZES for c in levels] + [(512, levels[-1], "arrow")]
            for rows, clients, kind in cells:
                chosen = all_rows[:rows]
                if kind == "json":
                    body, content_type = json.dumps({"rows": chosen}).encode(), "application/json"
                else:
                    body, content_type = _arrow_body(chosen), ARROW
                batch = batch_from_body(body, content_type, CRITEO, max_rows=rows)
                base = _predictor_times(predictor, batch, seconds)
                served = _load(service.url, body, content_type, clients, seconds)
                records += _records(rows, clients, kind, served, base)
    return records
