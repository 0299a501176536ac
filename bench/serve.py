"""``sparseps bench serve``: the prediction service against today's, the in-process
Predictor and the same Predictor behind Ray Serve, in one run (issue 60).

Services, each measured alone (started, its cells run, stopped), on the same model and
the same request bodies:

- ``today``: ``sparseps serve`` of commit ``BASELINE_REF`` (the service before issue 60:
  one process, one model call per request, rows copied into memory), run from a
  ``git worktree`` of it; where no git checkout is at hand, this code with
  ``--workers 1 --batch-max-rows 0`` (``params.today`` says which);
- ``sparseps``: ``sparseps serve`` as it is now (``--workers`` = the cores, dynamic
  batching with its defaults);
- ``ray``: the same model's ``Predictor`` behind Ray Serve, as many replicas as the
  service has workers (``bench/_serve_ray.py``; skipped with a line when ``ray[serve]``
  is not installed).

Cells (``rows`` per request, ``clients`` concurrent keep-alive connections):
1-row JSON from 1 client; 1-row JSON from 64 clients (quick: 16); 512-row Arrow from
4 clients. Records per service and cell: ``serve_rows_per_s``, ``serve_p50_ms``,
``serve_p99_ms``, each with the in-process baseline (``Predictor.predict_batch`` in this
process on the same rows already parsed, one thread, one call after another: its rows/s,
its p50 and p99), and ``serve_vs_today_rows_per_s`` (a service's rows/s against today's
in the same cell). ``load_average`` records the machine's 1-minute load at the start and
the end: figures from a loaded machine are the machine's, rerun them on a quiet one.

The clients run on one asyncio loop of this process (``bench/_serve_load.py``), raw
HTTP/1.1, so that 64 of them cost little CPU; on a small machine they still share its
cores with the service. The model is what ``sparseps demo --rows N`` trains and saves
(wide&deep, 26 slots, dim 8, hidden 400-400-400); request rows are its test rows.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sparseps.benchmarking import BenchRecord, bench_dir

BASELINE_REF = "a54d5f9"  # main before issue 60
SECONDS, QUICK_SECONDS = 5.0, 1.0
DEMO_ROWS, QUICK_DEMO_ROWS = 50_000, 4_000
MANY, QUICK_MANY = 64, 16
ARROW = "application/vnd.apache.arrow.stream"
JSON = "application/json"


def _model(work: Path, rows: int) -> tuple[Path, Path]:
    """Train and save a model with ``sparseps demo``; returns (inference dir, test file)."""
    done = subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "demo", "--rows", str(rows), "--out",
         str(work / "demo"), "--json"],
        capture_output=True, text=True, timeout=1800,
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _today(model: Path, work: Path) -> Iterator[tuple[str, str]]:
    """Today's service: ``BASELINE_REF``'s code from a git worktree; (url, what it is)."""
    from sparseps.serving import ServeProcess

    repo = bench_dir().parent
    tree = work / "today"
    made = subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), BASELINE_REF],
        capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode != 0:  # no checkout: the new code in the old shape
        extra = ["--batch-max-rows", "0"]
        with ServeProcess(model, poll_s=60, extra_args=extra, workers=1) as service:
            yield service.url, "this code, --workers 1 --batch-max-rows 0"
        return
    ready = work / "today-ready.json"
    log = open(work / "today.log", "wb")  # noqa: SIM115 (closed below)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = subprocess.Popen(
        [sys.executable, "-m", "sparseps.cli", "serve", str(model), "--port", "0",
         "--poll-s", "60", "--ready-file", str(ready)],
        cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not ready.is_file():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"today's service did not start: {work / 'today.log'}")
            time.sleep(0.1)
        yield json.loads(ready.read_text())["url"], f"commit {BASELINE_REF} (git worktree)"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        log.close()
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)  # fmt: skip


@contextlib.contextmanager
def _ours(model: Path, workers: int) -> Iterator[tuple[str, str]]:
    from sparseps.serving import ServeProcess

    with ServeProcess(model, poll_s=60, workers=workers) as service:
        yield service.url, f"--workers {workers}"


@contextlib.contextmanager
def _ray(model: Path, replicas: int) -> Iterator[tuple[str, str]]:
    sys.path.insert(0, str(bench_dir()))
    import _serve_ray

    try:
        url = _serve_ray.start(model, replicas, _free_port(), replicas)
        yield url, f"ray serve, {replicas} replicas"
    finally:
        _serve_ray.stop()


def _predictor_times(predictor, batch, seconds: float) -> list[float]:
    predictor.predict_batch(batch)
    times = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop or len(times) < 5:
        start = time.perf_counter()
        predictor.predict_batch(batch)
        times.append(time.perf_counter() - start)
    return times


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3


def run(quick: bool = False) -> list[BenchRecord]:
    import orjson
    import torch

    sys.path.insert(0, str(bench_dir()))
    from _serve_load import load, request_bytes

    from sparseps.checkpoint.predictor import Predictor
    from sparseps.data import CRITEO
    from sparseps.serving.requests import batch_from_body, criteo_request_rows

    torch.set_num_threads(1)  # as the service (ServeConfig.torch_threads)
    seconds = QUICK_SECONDS if quick else SECONDS
    many = QUICK_MANY if quick else MANY
    cores = len(os.sched_getaffinity(0))
    records: list[BenchRecord] = [BenchRecord("load_average", os.getloadavg()[0], "",
                                              params={"when": "start", "cores": cores})]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        work = Path(tmp)
        model, test_file = _model(work, QUICK_DEMO_ROWS if quick else DEMO_ROWS)
        rows = criteo_request_rows(test_file, 512)
        one = orjson.dumps({"rows": rows[:1]})
        cells = [  # (name, rows, clients, body, content type)
            ("json1", 1, 1, one, JSON),
            ("json1", 1, many, one, JSON),
            ("arrow512", 512, 4, _arrow_body(rows), ARROW),
        ]
        predictor = Predictor(model)
        inproc = {}
        for name, n, _, body, kind in cells:
            if (name, n) not in inproc:
                batch = batch_from_body(body, kind, CRITEO, max_rows=n)
                inproc[name, n] = _predictor_times(predictor, batch, seconds)
        del predictor
        services = {
            "today": lambda: _today(model, work),
            "sparseps": lambda: _ours(model, cores),
            "ray": lambda: _ray(model, cores),
        }
        measured: dict[tuple[str, str, int], float] = {}
        for service, opened in services.items():
            try:
                context = opened()
                url, what = context.__enter__()
            except ImportError as exc:
                print(f"bench serve: {service} skipped ({exc})", file=sys.stderr)
                continue
            try:
                for name, n, clients, body, kind in cells:
                    latencies, wall = load(url, request_bytes(url, body, kind), clients, seconds)
                    base = inproc[name, n]
                    params = {"service": service, "what": what, "body": name, "rows": n,
                              "clients": clients, "requests": len(latencies)}  # fmt: skip
                    rate = n * len(latencies) / wall
                    measured[service, name, clients] = rate
                    records += [
                        BenchRecord("serve_rows_per_s", rate, "rows/s",
                                    n * len(base) / sum(base), params),
                        BenchRecord("serve_p50_ms", _ms(latencies, 50), "ms", _ms(base, 50),
                                    params),
                        BenchRecord("serve_p99_ms", _ms(latencies, 99), "ms", _ms(base, 99),
                                    params),
                    ]  # fmt: skip
                    today = measured.get(("today", name, clients))
                    if service != "today" and today:
                        records.append(BenchRecord("serve_vs_today_rows_per_s", rate,
                                                   "rows/s", today, params))  # fmt: skip
            finally:
                context.__exit__(None, None, None)
    records.append(BenchRecord("load_average", os.getloadavg()[0], "",
                               params={"when": "end", "cores": cores}))  # fmt: skip
    records += must_show(records, many)
    return records


# issue 60's must-show cells: (record metric, body, clients (None: the many), what is
# compared, the target, its test on the figure)
TARGETS = [
    ("serve_p50_ms", "json1", 1, "p50 ms", "<= 3 ms", lambda r: r.value <= 3.0),
    ("serve_vs_today_rows_per_s", "json1", None, "rows/s vs today", ">= 10x today",
     lambda r: r.ratio is not None and r.ratio >= 10.0),
    ("serve_p99_ms", "json1", None, "p99 ms", "<= 50 ms", lambda r: r.value <= 50.0),
    ("serve_rows_per_s", "arrow512", 4, "rows/s vs in-process", ">= 1.0x in-process",
     lambda r: r.ratio is not None and r.ratio >= 1.0),
]  # fmt: skip


def must_show(records: list[BenchRecord], many: int) -> list[BenchRecord]:
    """One ``serve_must_show`` record per target of issue 60, for the ``sparseps`` service
    (``params``: the cell, the target, ``met``, the load at start and end), also printed
    to stderr as a table; a cell the run did not measure is ``met: false``."""
    loads = [r.value for r in records if r.metric == "load_average"]
    load = "-".join(f"{x:.1f}" for x in loads)
    out = []
    lines = [f"bench serve: issue 60's targets (sparseps service; load average {load})"]
    for metric, body, clients, what, target, test in TARGETS:
        clients = many if clients is None else clients
        found = [r for r in records if r.metric == metric and r.params.get("service") == "sparseps"
                 and r.params.get("body") == body and r.params.get("clients") == clients]  # fmt: skip
        cell = f"{body}, {clients} clients: {what}"
        if not found:
            lines.append(f"  {cell:<40} not measured   target {target:<20} met: no")
            out.append(BenchRecord("serve_must_show", float("nan"), "", None,
                                   {"cell": cell, "target": target, "met": False, "load": load}))  # fmt: skip
            continue
        record, met = found[0], bool(test(found[0]))
        figure = f"{record.value:.4g}" + (f" ({record.ratio:.2f}x)" if record.ratio else "")
        lines.append(f"  {cell:<40} {figure:<22} target {target:<20} met: {'yes' if met else 'no'}")
        out.append(BenchRecord("serve_must_show", record.value, record.unit, record.baseline,
                               {"cell": cell, "target": target, "met": met, "load": load}))  # fmt: skip
    print("\n".join(lines), file=sys.stderr, flush=True)
    return out
