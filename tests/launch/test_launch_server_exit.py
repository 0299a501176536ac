"""A server that exits before the workers are done fails the job fast, whatever its code.

The workers' RPC timeout is set far above the bound the tests assert (120 s against 20 s),
so only the launcher can have stopped the job; ``--max-restarts 2`` checks that a server
exit never restarts the worker group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sparseps.testing import wait_until
from sparseps.testing.jobs import (
    assert_all_gone,
    clean_env,
    launch_argv,
    read_pids,
    text,
)

JOB = Path(__file__).resolve().parent / "scripts" / "job.py"  # the launcher tests' job

pytestmark = pytest.mark.timeout(150)

BOUND_S = 20.0  # far below SPARSEPS_RPC_TIMEOUT


def _launch(tmp_path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        launch_argv("--server-num", "2", "--worker-num", "2", "--max-restarts", "2",
                    "--grace-s", "2", "--log-dir", str(tmp_path / "log"), str(JOB), mode,
                    "--dir", str(tmp_path)),
        cwd=tmp_path, env=clean_env(SPARSEPS_RPC_TIMEOUT="120"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait(launcher: subprocess.Popen, predicate, what: str) -> None:
    """Wait for ``predicate`` (bounded); fail at once, with its output, if the launcher ended."""
    wait_until(lambda: predicate() or launcher.poll() is not None, 90, what)
    if not predicate():
        out, err = launcher.communicate()
        raise AssertionError(f"the launcher ended ({launcher.returncode}) before {what}: {err}")


def _finish(launcher: subprocess.Popen, since: float) -> tuple[int, str, float]:
    try:
        _, err = launcher.communicate(timeout=BOUND_S + 30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    return launcher.returncode, err, time.monotonic() - since


def _server(log, rank: int) -> dict:
    return next(c for c in read_pids(log)["children"] if (c["role"], c["rank"]) == ("server", rank))


def _maps_torch(pid: int) -> bool:
    """Whether the process has torch's library mapped (it imported torch)."""
    with open(f"/proc/{pid}/maps") as maps:
        return "libtorch" in maps.read()


def _check_named(log, err: str, pid: int, how: str) -> None:
    pattern = rf"server 0 \(pid {pid}\) {how} before every worker finished"
    assert re.search(pattern, err), err
    assert re.search(pattern, text(log / "launcher.log")), text(log / "launcher.log")
    record = assert_all_gone(log, within=5.0)
    # no worker-group restart: every process ran once
    assert sorted((c["role"], c["rank"], c["attempt"]) for c in record["children"]) == [
        ("server", 0, 0), ("server", 1, 0), ("worker", 0, 0), ("worker", 1, 0),
    ]  # fmt: skip
    assert "restarting all workers" not in text(log / "launcher.log")


def test_sigterm_to_a_server_stops_the_job_and_names_it(tmp_path):
    log = tmp_path / "log"
    launcher = _launch(tmp_path, "pull")
    try:
        for rank in (0, 1):
            _wait(
                launcher,
                lambda r=rank: (tmp_path / f"pulling.{r}").exists(),
                f"worker {rank} to pull",
            )
        server = _server(log, 0)
        # the launcher and the servers never import torch (~3 s of CPU each on 2 cores;
        # the launcher's import came before its children's start); workers do
        assert not _maps_torch(launcher.pid) and not _maps_torch(server["pid"])
        worker = next(c for c in read_pids(log)["children"] if c["role"] == "worker")
        assert _maps_torch(worker["pid"])
        os.kill(server["pid"], signal.SIGTERM)  # the server handles it and exits 0
        killed = time.monotonic()
    except BaseException:
        launcher.kill()
        launcher.communicate()
        raise
    code, err, took = _finish(launcher, killed)
    assert took < BOUND_S, (took, err)
    assert code != 0, err
    _check_named(log, err, server["pid"], r"(exited with code 0|was killed by signal 15)")


def test_a_server_stopped_by_a_client_before_the_workers_finish_fails_the_job(tmp_path):
    log = tmp_path / "log"
    launcher = _launch(tmp_path, "stop-server")
    try:
        _wait(launcher, (tmp_path / "stopping").exists, "worker 0 to stop server 0")
        stopped = time.monotonic()
    except BaseException:
        launcher.kill()
        launcher.communicate()
        raise
    code, err, took = _finish(launcher, stopped)
    assert took < BOUND_S, (took, err)
    assert code == 1, err  # a server's exit 0 is still a failure of the job
    _check_named(log, err, _server(log, 0)["pid"], "exited with code 0")
