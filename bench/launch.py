"""Job start: what launching a job costs before any training, with the launcher's fork
server (docs/launch.md) against every child a fresh interpreter, in the same run.

The job is ``sparseps launch`` with 2 servers and 2 workers (1 and 1 with ``--quick``) of
a script that does what a training script does before its first batch: import torch and
sparseps, ``sps.init()`` (the workers' rendezvous and gloo group), a barrier, ``stop``.
Rounds alternate the two ways (``SPARSEPS_FORK_SERVER`` unset, then ``=0``) so that both
see the same machine; each figure is the best of its rounds.

Records:

- ``job_start_cpu_s``: CPU seconds (user + system) of the launcher and every process of
  the job, read from the launcher's ``wait4`` (every process is reaped by its parent, so
  the launcher's figure holds them all); baseline: fresh interpreters. Lower is better.
- ``job_start_wall_s``: the launch command's wall time, start to exit; same baseline.

Run: ``sparseps bench launch [--quick] [--json]`` (5 rounds each; 2 with ``--quick``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparseps.benchmarking import BenchRecord

JOB = """
import torch  # noqa: F401 - every training script imports it
import sparseps as sps

sps.init()
if sps.is_server():
    sps.run_server()
else:
    sps.barrier_worker()
    sps.stop()
"""


def _launch(folder: Path, servers: int, workers: int, fork_server: bool) -> tuple[float, float]:
    """One launched job: (CPU seconds of the whole process tree, wall seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    if not fork_server:
        env["SPARSEPS_FORK_SERVER"] = "0"
    started = time.perf_counter()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "sparseps.cli", "launch", "--server-num", str(servers),
         "--worker-num", str(workers), "--log-dir", str(folder / "log"), "--no-metrics",
         str(folder / "job.py")],
        env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert launcher.stderr is not None
    stderr = launcher.stderr.read()
    _, status, usage = os.wait4(launcher.pid, 0)
    wall = time.perf_counter() - started
    launcher.returncode = os.waitstatus_to_exitcode(status)
    if launcher.returncode != 0:
        raise RuntimeError(f"bench launch: the job failed:\n{stderr.decode()[-3000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def run(quick: bool = False, rounds: int | None = None) -> list[BenchRecord]:
    servers, workers = (1, 1) if quick else (2, 2)
    rounds = rounds or (2 if quick else 5)
    best = {True: [float("inf"), float("inf")], False: [float("inf"), float("inf")]}
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-launch-") as tmp:
        folder = Path(tmp)
        (folder / "job.py").write_text(JOB)
        for _ in range(rounds):
            for fork_server in (True, False):
                cpu, wall = _launch(folder, servers, workers, fork_server)
                best[fork_server][0] = min(best[fork_server][0], cpu)
                best[fork_server][1] = min(best[fork_server][1], wall)
    params = {
        "servers": servers,
        "workers": workers,
        "rounds": rounds,
        "baseline": "every child a fresh interpreter (SPARSEPS_FORK_SERVER=0)",
        "cpus": os.cpu_count(),
    }
    return [
        BenchRecord("job_start_cpu_s", best[True][0], "s", best[False][0], params),
        BenchRecord("job_start_wall_s", best[True][1], "s", best[False][1], params),
    ]
