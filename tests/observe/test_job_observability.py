"""One launched training job (1 server, 2 workers, async WideDeep on synthetic data),
observed from outside while it runs:

- ``/metrics`` of every role and of the launcher, scraped over HTTP, hold every family of
  issue 20 with values checked against what the job did (samples counted == rows
  trained x passes, AUC == the pass's global AUC, table rows == the servers' stats);
- the status page, loaded by headless Chromium, shows every role and non-empty plots
  (a screenshot is kept in ``$SPARSEPS_TEST_ARTIFACTS``, default
  ``TMPDIR/sparseps-test-artifacts/status-page.png``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
from _jobtools import SCRIPTS, finish, read_pids, start_launch, wait_for
from prometheus_client.parser import text_string_to_metric_families

from sparseps.data.synthetic import write_dataset
from sparseps.rpc.client import PSClient

ROWS, FILES, PASSES = 1200, 2, 2
PHASES = ("read", "pull", "compute", "push", "wait")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The running job, once every worker finished training (they wait for DIR/release)."""
    tmp = tmp_path_factory.mktemp("observe-job")
    meta = write_dataset(tmp / "data", ROWS, seed=3, files=FILES, test_rows=10)
    log = tmp / "log"
    proc = start_launch(
        "--server-num", "1", "--worker-num", "2", "--log-dir", str(log), "--status-port", "0",
        str(SCRIPTS / "train_job.py"), "--train", str(tmp / "data" / "train"), "--dir", str(tmp),
        "--passes", str(PASSES), cwd=tmp,
    )  # fmt: skip
    try:
        wait_for(
            lambda: all((tmp / f"worker.{r}.json").exists() for r in (0, 1)), 120,
            "both workers to finish training", proc,
        )  # fmt: skip
        results = {r: json.loads((tmp / f"worker.{r}.json").read_text()) for r in (0, 1)}
        yield {"tmp": tmp, "log": log, "pids": read_pids(log), "results": results, "meta": meta}
    finally:
        (tmp / "release").write_text("1")
        out = finish(proc)
    assert proc.returncode == 0, out[-4000:]


def scrape(port: int) -> dict[str, list[tuple[dict, float]]]:
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    reply.raise_for_status()
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    found = [
        v for lab, v in metrics.get(name, ()) if all(lab.get(k) == x for k, x in labels.items())
    ]
    assert len(found) == 1, f"{name}{labels}: {metrics.get(name)}"
    return found[0]


def ports(pids: dict) -> dict[tuple[str, int], int]:
    return {(c["role"], c["rank"]): c["metrics_port"] for c in pids["children"]}


def test_metrics_of_every_role(job):
    pids, results = job["pids"], job["results"]
    by_role = ports(pids)
    assert set(by_role) == {("server", 0), ("worker", 0), ("worker", 1)}
    # workers: samples counted == rows trained, the step split, the last pass's metrics
    total = 0.0
    for rank in (0, 1):
        m = scrape(by_role[("worker", rank)])
        samples = value(m, "sparseps_worker_samples_total")
        assert samples == results[rank]["samples"] > 0
        assert value(m, "sparseps_worker_batches_total") == results[rank]["batches"]
        total += samples
        split = {p: value(m, "sparseps_worker_step_seconds_total", phase=p) for p in PHASES}
        assert split["compute"] > 0 and split["pull"] > 0 and split["read"] > 0, split
        assert all(v >= 0 for v in split.values()), split
        assert value(m, "sparseps_worker_staleness_pushes") >= 0
        assert value(m, "sparseps_worker_pass_auc", phase="train") == pytest.approx(
            results[rank]["auc"], abs=1e-12
        )
        assert 0 < results[rank]["auc"] < 1
        assert value(m, "sparseps_worker_pass_logloss", phase="train") == pytest.approx(
            results[rank]["logloss"], abs=1e-12
        )
        assert value(m, "sparseps_worker_pass", phase="train") == PASSES - 1
        assert value(m, "process_resident_memory_bytes") > 50e6  # a torch process
    assert total == ROWS * PASSES  # every row of every pass counted once, over both workers
    # servers: per-op counts and latency histograms, errors by kind, queue, table sizes
    with PSClient([c for c in _servers(job)], timeout=10, job_id=pids["job_id"]) as client:
        stats = client.stats()["servers"][0]
        with pytest.raises(Exception, match="no_such_table"):
            client.pull("no_such_table", __import__("numpy").array([1], "uint64")).wait()
    m = scrape(by_role[("server", 0)])
    batches = sum(r["batches"] for r in results.values())
    for op in ("pull", "push"):
        count = value(m, "sparseps_server_op_seconds_count", op=op)
        assert count >= (batches if op == "pull" else 1), (op, count, batches)
        assert value(m, "sparseps_server_op_seconds_sum", op=op) > 0
        assert value(m, "sparseps_server_op_seconds_bucket", op=op, le="+Inf") == count
    assert value(m, "sparseps_server_errors_total", kind="failed") == 1  # the pull above
    assert value(m, "sparseps_server_queue_depth") == 0
    assert set(stats["tables"]) == {"deep_emb", "wide_emb"}
    for name, table in stats["tables"].items():
        assert value(m, "sparseps_server_table_rows", table=name) == table["rows"] > 0
        assert value(m, "sparseps_server_table_bytes", table=name) == table["bytes_used"] > 0
    assert value(m, "sparseps_server_peak_rss_bytes") > 0
    assert value(m, "process_resident_memory_bytes") > 0
    # the launcher: liveness of every role, restarts
    m = scrape(pids["launcher_metrics_port"])
    for role, rank in by_role:
        assert value(m, "sparseps_launcher_role_up", role=role, rank=str(rank)) == 1
    assert value(m, "sparseps_launcher_restarts_total") == 0


def _servers(job) -> list[str]:
    env_line = next(
        line for line in (job["log"] / "launcher.log").read_text().splitlines()
        if line.startswith("  server 0:")
    )  # fmt: skip
    return [env_line.split(":", 1)[1].strip()]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:  # never a skip: CI installs it in the test command (README)
        pytest.fail(
            "chromium is not installed: apt-get install -y chromium (the README's test command does)"
        )
    return found


def _browser(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="sparseps-chromium-") as profile:
        return subprocess.run(
            [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip


def test_status_page_in_chromium(job):
    pids = job["pids"]
    url = f"http://127.0.0.1:{pids['status_port']}/"
    # the page's data: roles, series and tables (what the browser draws)
    status = httpx.get(url + "api/status", timeout=5).json()
    assert status["job_id"] == pids["job_id"]
    assert sorted((r["role"], r["rank"], r["alive"]) for r in status["roles"]) == [
        ("server", 0, True), ("worker", 0, True), ("worker", 1, True),
    ]  # fmt: skip
    assert all(r["last_line"] for r in status["roles"]), status["roles"]

    def auc_points() -> int:  # the sampler adds a point a second; AUC exists from pass 1 on
        series = httpx.get(url + "api/status", timeout=5).json()["series"]
        return sum("train" in point for point in series)

    wait_for(lambda: auc_points() >= 2, 30, "two samples of the pass AUC")  # a fast job
    # one headless Chromium run: the rendered DOM, and a screenshot kept as an artifact
    default = Path(tempfile.gettempdir()) / "sparseps-test-artifacts"
    folder = Path(os.environ.get("SPARSEPS_TEST_ARTIFACTS", default))
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / "status-page.png"
    shot.unlink(missing_ok=True)
    dom = _browser(
        "--virtual-time-budget=4000", "--window-size=1200,900", f"--screenshot={shot}",
        "--dump-dom", url,
    )  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert shot.stat().st_size > 10_000, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-loaded="1"' in html, html[:2000]
    for role in ("server-0", "worker-0", "worker-1"):
        assert f'data-role="{role}"' in html, role
    assert html.count('<td class="state">running</td>') == 3
    for plot in ("plot-samples", "plot-auc"):
        tag = html.split(f'id="{plot}"', 1)[1].split(">", 1)[0]
        points = int(tag.split('data-points="', 1)[1].split('"', 1)[0])
        assert points >= 2, (plot, tag)
        section = html.split(f'id="{plot}"', 1)[1].split("</svg>", 1)[0]
        assert "<polyline points=" in section
    assert 'data-server="0"' in html and "deep_emb" in html  # table sizes per server
    assert "no online pass reported" in html  # not an online job
