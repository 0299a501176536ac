"""A launched wide&deep job with ``--replicas 1`` survives a server killed with SIGKILL.

Three servers, two workers; once worker 0 has logged training progress, server 1 gets
SIGKILL. The job must finish with exit 0 and a test AUC within 0.005 of the same job
without the kill, the launcher's log must say which server was lost, and a replacement
server (``--max-restarts 1``) must have copied both of its shards back. The workers pause
(``--hold-file``) from the kill until the copy is done, so the replacement's start-up
time on a loaded machine cannot race the end of training. Sync mode makes
the two runs apply the same updates in the same order, so the kill (which loses no
acknowledged update) is all that could separate them: nothing is left to chance.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from sparseps.cli import main as cli_main
from sparseps.testing import wait_until
from sparseps.testing.jobs import clean_env, finish, launch_argv, read_pids, text

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "sparseps" / "jobs" / "wide_deep_job.py"
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("replica-data")
    # in this process: gen-data reads no environment; a fresh interpreter only added imports
    assert cli_main(["gen-data", "--rows", "24000", "--files", "4", "--test-rows", "6000",
                     "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    return out


def _start(data: Path, out: Path) -> subprocess.Popen:
    out.mkdir()
    hold = out / "hold"  # the workers pause while it exists (wide_deep_job --hold-file)
    command = launch_argv(
        "--server-num", "3", "--worker-num", "2", "--replicas", "1", "--max-restarts", "1",
        "--log-dir", str(out / "log"),
        "--no-metrics", str(JOB), "--train", str(data / "train"), "--test", str(data / "test"),
        "--result", str(out / "result.json"), "--hidden", "64,32", "--print-period", "5",
        "--calibrate-rows", "0", "--prior-rows", "2000", "--batch-size", "128", "--mode", "sync",
        "--lr", "0.003", "--sparse-lr", "0.05", "--hold-file", str(hold),
    )  # fmt: skip
    return subprocess.Popen(
        command, cwd=out, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def _server_pid(log: Path, rank: int) -> int | None:
    try:
        children = read_pids(log)["children"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return next((c["pid"] for c in children if c["role"] == "server" and c["rank"] == rank), None)


def test_job_survives_a_killed_server_with_the_same_auc(tmp_path, data):
    plain = _start(data, tmp_path / "plain")
    killed = _start(data, tmp_path / "killed")
    log, hold = tmp_path / "killed" / "log", tmp_path / "killed" / "hold"
    # worker 0 has logged progress (every 5 steps; about 94 steps per worker)
    wait_until(
        lambda: text(log / "worker.0.log").count("batch: [") >= 1, 150, "worker 0's progress lines"
    )
    hold.touch()  # the workers pause after their current batch, so that the replacement's
    pid = _server_pid(log, 1)  # copy surely ends before training does (no race)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: text(log / "server.1.log").count("re-replicated shard") == 2, 150,
        "the replacement's copies of shards 1 and 0",
    )  # fmt: skip
    hold.unlink()
    outputs = finish([plain, killed], 200)
    assert plain.returncode == 0, outputs[0][-3000:]
    assert killed.returncode == 0, outputs[1][-3000:]
    launcher = text(log / "launcher.log")
    assert "server 1 (pid" in launcher and "LOST" in launcher, launcher[-2000:]
    assert "starting a replacement for server 1" in launcher, launcher[-2000:]
    replacement = text(log / "server.1.log").split("restart attempt 1")[-1]
    assert "re-replicated shard 1 from server 2" in replacement, replacement[-2000:]
    assert "re-replicated shard 0 from server 0" in replacement, replacement[-2000:]
    attempts = [c["attempt"] for c in read_pids(log)["children"] if c["role"] == "server"]
    assert sorted(attempts) == [0, 0, 0, 1]
    worker_log = text(log / "worker.0.log") + text(log / "worker.1.log")
    assert "server 1 at" in worker_log and "is lost" in worker_log  # the clients noticed
    auc = {
        name: json.loads((tmp_path / name / "result.json").read_text())["test_auc"]
        for name in ("plain", "killed")
    }
    assert auc["plain"] > 0.55, auc  # the job learned something
    assert abs(auc["killed"] - auc["plain"]) <= 0.005, auc
