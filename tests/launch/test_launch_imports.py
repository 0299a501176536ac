"""The launcher process stays light: a whole job, servers stopped at the end included,
without importing numba or torch in the launcher (they are the children's)."""

from __future__ import annotations

import subprocess
import sys

from sparseps.testing.jobs import clean_env

JOB = """
import sparseps as sps

sps.init()
if sps.is_server():
    sps.run_server()
else:
    sps.barrier_worker()
    sps.stop()
"""


def _imported(stderr: str) -> set[str]:
    """Modules named by ``python -X importtime`` lines (this process's imports only)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_a_launched_job_runs_and_stops_without_numba_or_torch_in_the_launcher(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    argv = [sys.executable, "-X", "importtime", "-m", "sparseps.cli", "launch"]
    done = subprocess.run(
        [*argv, "--server_num", "1", "--trainer_num", "1", str(script)],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "completed" in done.stdout + done.stderr
    imported = _imported(done.stderr)
    assert "sparseps.launch.supervisor" in imported  # the flag took effect
    assert "sparseps.rpc.stop" in imported  # the servers were asked to stop
    assert not {"numba", "torch", "sparseps.rpc.client"} & imported
    # the stop answered: the server logged its exit rather than being killed
    assert "server 0 stopped" in (tmp_path / "log" / "server.0.log").read_text()
