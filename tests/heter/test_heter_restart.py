"""A heter worker SIGKILLed mid-pass restarts under ``--max-restarts`` (issue 57, item 3):
the job finishes, the launcher logs the restart, the trainers count the steps they had
in flight to it as lost and go on once it is back (its dense state from the servers), and
the test AUC stays close to the same job without the kill (async heter is a draw: see
AUC_BOUND; the exact 0.005 of the issue is tests/launch/test_ray_heter.py's, in sync)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from sparseps.cli import main as cli_main
from sparseps.testing import wait_until
from sparseps.testing.jobs import clean_env, launch_argv, read_pids, text

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "sparseps" / "jobs" / "wide_deep_job.py"
pytestmark = pytest.mark.timeout(600)
# async heter mode: two runs of this job without a kill differ by up to ~0.009 at a quiet
# box's staleness (0.7620 and 0.7706 seen on the Ray cluster, 0.7676 here), and more under
# load: CI at 2 cores saw an unkilled run of 0.7556 beside a killed one of 0.7712, a local
# suite a killed 0.7536 beside an unkilled 0.7728, and three unkilled runs side by side
# gave 0.7644-0.7719 (0.7574-0.7679 without request gathering, so gathering is not what
# varies). The kill's own effect (2 steps of 156 lost per trainer) is bounded by that draw
# (up to 0.019) and a margin, and only downwards: a restart that broke training costs
# more; a killed run luckier than its reference is no failure
AUC_BOUND = 0.03


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("heter-restart-data")
    assert cli_main(["gen-data", "--rows", "20000", "--files", "2", "--test-rows", "4000",
                     "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    return out


def _argv(tmp: Path, data: Path, *extra: str) -> list[str]:
    return launch_argv(
        "--server-num", "1", "--worker-num", "2", "--heter-worker-num", "1", "--log-dir",
        str(tmp / "log"), "--no-metrics", *extra, str(JOB), "--train", str(data / "train"),
        "--test", str(data / "test"), "--result", str(tmp / "result.json"), "--hidden", "32,16",
        "--batch-size", "128", "--calibrate-rows", "0", "--print-period", "1", "--lr", "0.003",
        "--epochs", "2",
    )  # fmt: skip


def test_a_killed_heter_worker_restarts_and_the_job_finishes(tmp_path, data):
    reference = tmp_path / "reference"
    reference.mkdir()
    done = subprocess.run(_argv(reference, data), cwd=reference, env=clean_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    want = json.loads((reference / "result.json").read_text())["test_auc"]

    killed = tmp_path / "killed"
    killed.mkdir()
    hold = killed / "hold"  # the trainers pause after each batch while it exists
    hold.touch()
    log = killed / "log"
    argv = [*_argv(killed, data, "--max-restarts", "1"), "--hold-file", str(hold)]
    proc = subprocess.Popen(argv, cwd=killed, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:

        def first_batch() -> bool:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            return "batch: [" in text(log / "worker.0.log")

        wait_until(first_batch, 200, "worker 0's first batch")
        pid = next(c["pid"] for c in read_pids(log)["children"] if c["role"] == "heter_worker")
        os.kill(pid, signal.SIGKILL)
        hold.unlink()
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    assert "restarting it (heter worker restart 1 of 1" in out, out[-4000:]
    heter_log = text(log / "heter_worker.0.log")
    assert heter_log.count("running heter worker 0") == 2, heter_log[-3000:]
    lost = [int(n) for w in (0, 1)
            for n in re.findall(r"the (\d+) step\(s\) in flight to it are lost",
                                text(log / f"worker.{w}.log"))]  # fmt: skip
    back = sum(text(log / f"worker.{w}.log").count("heter worker 0 is back") for w in (0, 1))
    assert lost and all(1 <= n <= 2 for n in lost) and back == len(lost), (lost, back)
    got = json.loads((killed / "result.json").read_text())
    print(f"\nkilled mid-pass: AUC {got['test_auc']:.4f} vs {want:.4f} without the kill; "
          f"steps lost per trainer {lost}")  # fmt: skip
    assert got["test_auc"] >= want - AUC_BOUND, (got["test_auc"], want)
