"""Heter workers in launched jobs: the launcher's flags, and a dead heter worker fails the
job fast, named (the training AUC of heter mode: tests/worker/test_training_modes.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sparseps.cli import main as cli_main
from sparseps.env import HETER_WORKERS, Role, RoleEnv, from_environ
from sparseps.errors import ConfigError
from sparseps.launch.spec import make_spec
from sparseps.testing import wait_until
from sparseps.testing.jobs import clean_env, launch_argv, read_pids, text

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "sparseps" / "jobs" / "wide_deep_job.py"
pytestmark = pytest.mark.timeout(240)


def test_the_spec_and_the_environment_carry_the_heter_workers(tmp_path):
    spec = make_spec(server_num=2, worker_num=2, heter_worker_num=1, log_dir=str(tmp_path))
    (heter,) = spec.heter_workers
    assert heter not in spec.servers and spec.local_heter_workers() == [0]
    assert "heter worker 0: " + heter in spec.describe()
    environ = spec.role_env(Role.HETER_WORKER, 0).to_environ()
    assert environ[HETER_WORKERS] == heter
    found = from_environ(environ)
    assert found is not None and found.role is Role.HETER_WORKER and found.heter_workers == (heter,)
    worker = from_environ(spec.role_env(Role.WORKER, 1).to_environ())
    assert worker is not None and worker.heter_workers == (heter,)
    with pytest.raises(
        ConfigError, match="SPARSEPS_RANK: 1 out of range 0..0 for role heter_worker"
    ):
        RoleEnv(
            Role.HETER_WORKER, 1, spec.servers, 2, spec.master, "log", "j", heter_workers=(heter,)
        )
    with pytest.raises(ConfigError, match="--heter-workers is required across nodes"):
        make_spec(servers="10.0.0.1:6000", workers="10.0.0.2", host="10.0.0.2",
                  heter_worker_num=1, key_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ConfigError, match="not a server's"):
        make_spec(servers="127.0.0.1:6000", heter_workers="127.0.0.1:6000")


def test_heter_flags_are_refused_where_they_do_not_apply(tmp_path, capsys):
    # `sparseps launch` in this process: each refusal comes before anything starts (five
    # interpreters, one per refusal, spent seconds of imports on the same checks)
    def refused(*args: str) -> str:
        assert cli_main(["launch", *args, "--log-dir", str(tmp_path / "log"), str(JOB)]) != 0
        assert not (tmp_path / "log").exists()  # refused before the launcher made anything
        return capsys.readouterr().err

    assert "--heter-device: the job has no heter workers" in refused("--heter-device", "cuda")
    # Ray places heter workers and picks their ports: a list of endpoints does not apply
    err = refused("--backend", "ray", "--heter-workers", "127.0.0.1:7000")
    assert "--heter-workers does not apply to --backend ray" in err
    assert "the job has no heter workers" in refused("--backend", "ray", "--heter-device", "cuda")
    err = refused("--backend", "ray", "--heter-worker-num", "2", "--heter-device", "cuda,cpu,cpu")
    assert "3 devices (cuda,cpu,cpu) for 2 heter workers" in err
    err = refused("--heter-worker-num", "1", "--heter-device", "gpu")
    assert "--heter-device: expected one of" in err


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("heter-data")
    # in this process: gen-data reads no environment; a fresh interpreter only added imports
    assert cli_main(["gen-data", "--rows", "6000", "--files", "2", "--test-rows", "1000",
                     "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    return out


def test_a_killed_heter_worker_fails_the_job_fast_and_named(tmp_path, data):
    hold = tmp_path / "hold"  # the workers pause after each batch while it exists
    hold.touch()
    log = tmp_path / "log"
    proc = subprocess.Popen(
        launch_argv(
            "--server-num", "1", "--worker-num", "2", "--heter-worker-num", "1",
            "--log-dir", str(log), "--no-metrics", str(JOB), "--train", str(data / "train"),
            "--test", str(data / "test"), "--result", str(tmp_path / "result.json"),
            "--hidden", "16", "--batch-size", "128",
            "--calibrate-rows", "0", "--print-period", "1", "--hold-file", str(hold),
        ),
        cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # a step went through the heter worker (worker 0 logs each batch) and the job holds
        def first_batch() -> bool:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            return "batch: [" in text(log / "worker.0.log")

        wait_until(first_batch, 150, "worker 0's first batch")
        pid = next(c["pid"] for c in read_pids(log)["children"] if c["role"] == "heter_worker")
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, out[-3000:]
    assert "heter_worker 0 (pid" in out and "killed by signal 9 (SIGKILL)" in out, out[-3000:]
    assert "a heter worker exit always stops the job" in out, out[-3000:]
    assert took < 30, took  # the launcher noticed the exit, not a worker's RPC timeout


def test_each_heter_worker_runs_on_its_own_device_kind(tmp_path, data):
    # --heter-device with one kind per heter worker: each process gets its own (auto is
    # cuda where a GPU is visible, else cpu); the other roles get none
    log = tmp_path / "log"
    done = subprocess.run(
        launch_argv(
            "--server-num", "1", "--worker-num", "2", "--heter-worker-num", "2",
            "--heter-device", "cpu,auto", "--log-dir", str(log), "--no-metrics", str(JOB),
            "--train", str(data / "train"), "--test", str(data / "test"), "--result",
            str(tmp_path / "result.json"), "--hidden", "16", "--batch-size", "256",
            "--calibrate-rows", "0",
        ),
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    auto = "cuda:0" if torch_cuda() else "cpu"
    assert " on cpu (" in text(log / "heter_worker.0.log")
    assert f" on {auto} (" in text(log / "heter_worker.1.log")
    # both took steps: the trainers route by throughput over both
    for rank in (0, 1):
        found = re.search(r"after (\d+) steps", text(log / f"heter_worker.{rank}.log"))
        assert found is not None and int(found.group(1)) > 0, rank


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
