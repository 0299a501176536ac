"""Heter workers placed by Ray (issue 57, item 4) on a real two-node Ray cluster on this
machine (:mod:`sparseps.testing.ray_cluster`, shared with test_ray_backend.py): the heter worker's bundle lands on node_b by its
``--heter-resources``; one heter worker SIGKILLed mid-pass
restarts in place under ``--max-restarts``, the job finishes, the restart is logged, and
the test AUC is within 0.005 of the same job without the kill (run by the local launcher
beside it: heter in sync mode gives the same model wherever its roles run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseps.testing import wait_until
from sparseps.testing.jobs import alive, can_bind, clean_env, finish, job_processes, launch_argv
from sparseps.testing.jobs import text as read_text

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

from sparseps.testing.ray_cluster import ANYWHERE, NODE_B, ray_env, ray_launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not can_bind("127.0.0.3"), reason="127.0.0.2/3 cannot be bound here"),
]
TRAIN_JOB = ROOT / "tests" / "worker" / "jobs" / "train_job.py"
AUC_BOUND = 0.005  # the issue's
HETER_ON_B = '{"CPU": 0.5, "node_b": 0.5}'


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ray-heter-data")
    subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "gen-data", "--rows", "20000", "--files", "2",
         "--test-rows", "4000", "--out", str(out), "--no-progress"],
        env=clean_env(), check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    np.save(out / "keys.npy", np.zeros(1, np.uint64))
    return out


def _job(tmp: Path, data: Path, *extra: str) -> list[str]:
    """Heter in sync mode: every run of it gives the same model, wherever its roles run, so
    the gap to the run without the kill is the kill's (the steps it lost), not async
    mode's draw."""
    return [
        "--server-num", "1", "--worker-num", "2", "--heter-worker-num", "1", "--heter-device",
        "cpu", "--no-metrics", *extra, str(TRAIN_JOB), "--train", str(data / "train"),
        "--test", str(data / "test"), "--keys", str(data / "keys.npy"), "--out",
        str(tmp / "out.npz"), "--mode", "heter_sync", "--batch-size", "64", "--passes", "2",
    ]  # fmt: skip


def _on_ray(address: str, tmp: Path, data: Path, *extra: str) -> list[str]:
    return ray_launch(address, tmp / "log", "--server-resources", ANYWHERE, "--worker-resources",
                      ANYWHERE, "--heter-resources", HETER_ON_B, *_job(tmp, data, *extra))  # fmt: skip


def _auc(tmp: Path) -> float:
    return float(json.loads((tmp / "out.npz.json").read_text())["test_auc"])


def test_heter_workers_placed_by_ray_restart_after_sigkill(ray_cluster, data, tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    hold = killed / "hold"  # the trainers pause after each batch while it exists
    hold.touch()
    # the job without the kill under the local launcher (the same model: heter sync), beside
    # the Ray job: the two ran one after the other on Ray, ~25 s more of the suite
    plain = subprocess.Popen(
        launch_argv("--log-dir", str(reference / "log"), *_job(reference, data)),
        cwd=reference, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    proc = subprocess.Popen(
        [*_on_ray(ray_cluster, killed, data, "--max-restarts", "1"), "--hold-file", str(hold)],
        cwd=killed, env=ray_env(ray_cluster), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    log = killed / "log"
    try:

        def first_batch() -> bool:
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            return hold.with_suffix(".seen").exists()

        wait_until(first_batch, 240, "the trainers' first batch")
        record = json.loads((log / "pids.json").read_text())
        (heter,) = [c for c in record["children"] if c["role"] == "heter_worker"]
        assert heter["node"] == NODE_B  # Ray placed it by its resources
        os.kill(heter["pid"], signal.SIGKILL)
        hold.unlink()
        out, plain_out = finish([proc, plain], 400)
    finally:
        for started in (proc, plain):
            if started.poll() is None:
                started.kill()
                started.communicate()
    assert plain.returncode == 0, plain_out[-4000:]
    assert proc.returncode == 0, out[-4000:] + read_text(log / "heter_worker.0.log")[-3000:]
    launcher = read_text(log / "launcher.log") + out
    assert "restarting it (heter worker restart 1 of 1" in launcher, launcher[-4000:]
    assert read_text(log / "heter_worker.0.log").count("running heter worker 0") == 2
    # sync: the step in flight is lost on both trainers (both sent it to heter worker 0)
    lost = [read_text(log / f"worker.{w}.log").count("the 1 step(s) in flight to it are lost")
            for w in (0, 1)]  # fmt: skip
    assert lost == [1, 1], lost
    record = json.loads((log / "pids.json").read_text())
    heters = [c for c in record["children"] if c["role"] == "heter_worker"]
    assert [c["attempt"] for c in heters] == [0, 1] and {c["node"] for c in heters} == {NODE_B}
    assert not any(alive(c["pid"]) for c in record["children"])
    assert job_processes(record["job_id"]) == []
    want, got = _auc(reference), _auc(killed)
    print(f"\nRay, heter worker on node_b SIGKILLed mid-pass: AUC {got:.4f} vs {want:.4f} "
          f"without the kill; lost-step lines per trainer {lost}")  # fmt: skip
    assert abs(got - want) <= AUC_BOUND
