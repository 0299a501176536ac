"""``sparseps launch`` end to end: real servers and workers as processes on loopback.

Each test asserts on exit codes, pids and values; log text is checked only where the
log line itself is the contract (the server start line, the restart line).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from sparseps.testing import wait_until
from sparseps.testing.jobs import (
    MINIMAL,
    alive,
    clean_env,
    finish,
    launch_argv,
    read_pids,
    run_launch,
    start_two_launchers,
    text,
)
from sparseps.testing.jobs import assert_all_gone as _assert_all_gone
from sparseps.testing.jobs import results as _results

JOB = Path(__file__).resolve().parent / "scripts" / "job.py"  # the launcher tests' job

pytestmark = pytest.mark.timeout(150)


def test_two_servers_two_workers_push_pull_and_check_values(tmp_path):
    log, out = tmp_path / "log", tmp_path / "out"
    r = run_launch(
        "--server-num", "2", "--worker-num", "2", "--log-dir", str(log), str(MINIMAL), "--out", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in log.glob("*.log")) == [
        "launcher.log", "server.0.log", "server.1.log", "worker.0.log", "worker.1.log",
    ]  # fmt: skip
    record = _assert_all_gone(log)
    assert record["job_id"] in r.stdout  # the banner
    endpoints = re.findall(r"server \d: (127\.0\.0\.1:\d+)", r.stdout)
    for rank in (0, 1):
        text = (log / f"server.{rank}.log").read_text()
        assert f"running server with rank id: {rank}, endpoint: {endpoints[rank]}" in text
    results = _results(out, 2)
    for rank, res in enumerate(results):
        assert (res["rank"], res["world"], res["servers"], res["ok"]) == (rank, 2, 2, True)
        before, after = np.array(res["before"]), np.array(res["after"])
        # SGD lr=0.5, 3 rounds, workers push 1*g and 2*g: every row moved by -4.5 * [1, 2, 3, 4]
        np.testing.assert_allclose(
            after - before, np.tile(-4.5 * np.arange(1, 5), (6, 1)), atol=1e-4
        )
    np.testing.assert_array_equal(results[0]["after"], results[1]["after"])
    # worker 0's output is also on the launcher's console
    assert "worker 0 of 2: all 6 rows as expected" in r.stdout + r.stderr


def test_example_runs_alone_and_under_the_launcher(tmp_path):
    # the two runs share nothing (each its folder, ports and processes): side by side
    log = tmp_path / "log"
    with ThreadPoolExecutor(max_workers=1) as pool:
        launching = pool.submit(
            run_launch, "--server-num", "1", "--worker-num", "2", "--log-dir", str(log),
            str(MINIMAL), "--out", str(tmp_path / "launched"), cwd=tmp_path,
        )  # fmt: skip
        alone = subprocess.run(
            [sys.executable, str(MINIMAL), "--out", str(tmp_path / "alone")],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        launched = launching.result()
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "local mode" in alone.stderr
    server_pid = int(re.search(r"background server \(pid (\d+)", alone.stderr).group(1))
    assert not alive(server_pid)
    (res,) = _results(tmp_path / "alone", 1)
    assert (res["world"], res["servers"], res["ok"]) == (1, 1, True)
    np.testing.assert_allclose(
        np.array(res["after"]) - np.array(res["before"]),
        np.tile(-1.5 * np.arange(1, 5), (6, 1)),
        atol=1e-4,
    )

    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert all(r["ok"] and r["world"] == 2 for r in _results(tmp_path / "launched", 2))
    _assert_all_gone(log)


def test_failing_worker_stops_the_job_and_names_it(tmp_path):
    log = tmp_path / "log"
    r = run_launch(
        "--server-num", "2", "--worker-num", "2", "--log-dir", str(log), str(JOB), "fail",
        "--dir", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    ended = time.time()
    assert r.returncode == 3, r.stdout + r.stderr
    assert re.search(r"worker 1 \(pid \d+\) exited with code 3", r.stderr), r.stderr
    assert "worker 1: exiting with code 3" in r.stderr  # the tail of its log
    # fail fast: the launcher ended within seconds of worker 1's last line, not after
    # worker 0's 120 s sleep (room left for a loaded box)
    assert ended - (log / "worker.1.log").stat().st_mtime < 25.0
    # the launcher killed them before it ended (fail fast is the line above); a killed
    # process's teardown can take over a second on a loaded 2-core machine (CI, stop 49)
    record = _assert_all_gone(log, within=5.0)
    assert len(record["children"]) == 4


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_the_launcher_stops_every_child(tmp_path, sig):
    log = tmp_path / "log"
    launcher = subprocess.Popen(
        launch_argv("--server-num", "1", "--worker-num", "2", "--log-dir", str(log), str(JOB), "sleep",
                    "--dir", str(tmp_path)),
        cwd=tmp_path, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for rank in (0, 1):
            wait_until(
                lambda rank=rank: f"worker {rank} ready" in text(log / f"worker.{rank}.log"),
                90,
                f"worker {rank} to start",
            )
        pids = [c["pid"] for c in read_pids(log)["children"]]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        launcher.send_signal(sig)
        launcher.wait(timeout=15)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + sig, launcher.stderr.read()
    # killed by the launcher on its way out; a killed process's teardown can take over a
    # second on a loaded 2-core machine (as in the failing-worker test above)
    _assert_all_gone(log, within=5.0)


def test_failed_worker_is_restarted(tmp_path):
    log = tmp_path / "log"
    r = run_launch(
        "--server-num", "1", "--worker-num", "2", "--max-restarts", "1", "--log-dir", str(log),
        str(JOB), "restart", "--dir", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"worker 1 \(pid \d+\) on \S+ exited with code 7: restarting all workers "
                     r"\(restart 1 of 1", r.stderr), r.stderr  # fmt: skip
    record = _assert_all_gone(log)
    attempts = [(c["role"], c["rank"], c["attempt"]) for c in record["children"]]
    # the whole worker group starts again (generation 1); the server keeps running
    assert sorted(attempts) == [
        ("server", 0, 0),
        ("worker", 0, 0),
        ("worker", 0, 1),
        ("worker", 1, 0),
        ("worker", 1, 1),
    ]
    first = int((tmp_path / "worker1.attempted").read_text())
    second = int((tmp_path / "worker1.done").read_text())
    assert first != second and (tmp_path / "worker0.done").exists()


def test_barrier_timeout_names_the_missing_worker(tmp_path):
    log = tmp_path / "log"
    r = run_launch(
        "--server-num", "1", "--worker-num", "2", "--log-dir", str(log), str(JOB), "barrier",
        "--dir", str(tmp_path), cwd=tmp_path, env=clean_env(SPARSEPS_BARRIER_WARN_S="0.5"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    record = json.loads((tmp_path / "barrier.json").read_text())
    assert record["raised"] and record["op"] == "barrier" and record["role"] == "worker"
    assert record["rank"] == [1]
    assert 2.0 <= record["seconds"] < 10 and record["setting"] == "barrier_worker(timeout=)"
    warning = [
        line for line in (log / "worker.0.log").read_text().splitlines() if "WARNING" in line
    ]
    assert any("still waiting for worker rank(s) [1]" in line for line in warning)


def test_two_launchers_run_one_job_across_two_nodes(tmp_path):
    nodes = start_two_launchers(tmp_path, MINIMAL, "--out", str(tmp_path / "out"))
    procs = [proc for _, _, proc in nodes]
    outputs = finish(procs, timeout=120)
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(outputs)
    results = _results(tmp_path / "out", 2)
    assert all(r["ok"] and r["world"] == 2 and r["servers"] == 2 for r in results)
    np.testing.assert_array_equal(results[0]["after"], results[1]["after"])
    job_ids = set()
    for rank, (_, log, _) in enumerate(nodes):
        assert sorted(p.name for p in log.glob("*.log")) == [
            "launcher.log",
            f"server.{rank}.log",
            f"worker.{rank}.log",
        ]
        job_ids.add(_assert_all_gone(log)["job_id"])
    assert len(job_ids) == 1  # both launchers derived the same job id


def test_fleetrun_spellings_of_the_counts(tmp_path):
    log = tmp_path / "log"
    r = run_launch(
        "--server_num=2", "--trainer_num=2", "--log_dir", str(log), str(MINIMAL),
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    record = _assert_all_gone(log)
    assert sorted((c["role"], c["rank"]) for c in record["children"]) == [
        ("server", 0), ("server", 1), ("worker", 0), ("worker", 1),
    ]  # fmt: skip
    assert all(
        res["ok"] and res["world"] == 2 and res["servers"] == 2
        for res in _results(tmp_path / "out", 2)
    )


LOCAL_SCRIPT = """
import logging, sys, time
import sparseps as sps
logging.basicConfig(level=logging.INFO)
env = sps.init()
assert env.local and sps.is_worker() and sps.worker_num() == 1 and sps.server_num() == 1
sps.barrier_worker(timeout=5)
print("ready", flush=True)
if sys.argv[1] == "raise":
    raise RuntimeError("script failed")
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_local_mode_server_never_outlives_the_script(tmp_path, how):
    script = tmp_path / "local_job.py"
    script.write_text(LOCAL_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), how], cwd=tmp_path, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready"
        if how == "sigkill":
            proc.kill()  # no exit hook runs: the kernel's parent-death signal stops the server
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (1 if how == "raise" else -signal.SIGKILL)
    if how == "raise":
        assert "RuntimeError: script failed" in err
    match = re.search(r"background server \(pid (\d+)", err)
    assert match, err
    server = int(match.group(1))
    wait_until(lambda: not alive(server), 5.0, f"local server {server} to exit")
