"""Job start: what launching a job costs before any training, with the launcher's fork
server (docs/launch.md) against every child a fresh interpreter, and with zygotes
(``SPARSEPS_ZYGOTE_DIR``, warm) against the fork server, in the same run.

The job is ``sparseps launch`` with 2 servers and 2 workers (1 and 1 with ``--quick``) of
a script that does what a training script does before its first batch: import torch and
sparseps, ``sps.init()`` (the workers' rendezvous and gloo group), a barrier, ``stop``.
Rounds alternate the three ways (``SPARSEPS_FORK_SERVER`` unset, then ``=0``, then a
zygote folder whose zygotes two launches before the rounds started) so that all see the
same machine; each figure is the best of its rounds.

Records:

- ``job_start_cpu_s``: CPU seconds (user + system) of the launcher and every process of
  the job, read from the launcher's ``wait4`` (every process is reaped by its parent, so
  the launcher's figure holds them all); baseline: fresh interpreters. Lower is better.
- ``job_start_wall_s``: the launch command's wall time, start to exit; same baseline.
- ``zygote_job_start_cpu_s`` / ``zygote_job_start_wall_s``: the same with zygotes; the
  baseline is the fork server's figure. The fork servers a zygote forks are its children,
  not the launcher's: their CPU (and their children's) is read from the zygotes'
  ``/proc/PID/stat`` (own and reaped children's times) before and after the launch.

Run: ``sparseps bench launch [--quick] [--json]`` (5 rounds each; 2 with ``--quick``).
"""

from __future__ import annotations

import os
import shutil
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


def _launch(folder: Path, servers: int, workers: int, way: str) -> tuple[float, float]:
    """One launched job (``way``: fork_server, fresh or zygote): (CPU seconds of the whole
    process tree, wall seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    if way == "fresh":
        env["SPARSEPS_FORK_SERVER"] = "0"
    zygotes_before = 0.0
    if way == "zygote":
        env["SPARSEPS_ZYGOTE_DIR"] = str(folder / "zygotes")
        zygotes_before = _zygotes_cpu(folder / "zygotes")
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
    cpu = usage.ru_utime + usage.ru_stime
    if way == "zygote":
        time.sleep(3.0)  # a zygote reaps its exited fork servers every 2 s
        cpu += _zygotes_cpu(folder / "zygotes") - zygotes_before
    return cpu, wall


def _zygotes_cpu(folder: Path) -> float:
    """CPU seconds of the zygotes of ``folder``: their own and their reaped children's."""
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(folder).encode() in (entry / "cmdline").read_bytes():
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        except OSError:
            continue
    return total / tick


def _warm_zygotes(folder: Path, servers: int, workers: int) -> None:
    zygotes = folder / "zygotes"
    zygotes.mkdir(mode=0o700)
    for _ in range(2):  # the second launch of an environment starts its zygotes
        _launch(folder, servers, workers, "zygote")
    deadline = time.monotonic() + 120
    while len(list(zygotes.glob("*.sock"))) < 2 or list(zygotes.glob("*.starting")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench launch: no zygotes in {zygotes} after 120 s")
        time.sleep(0.2)


def run(quick: bool = False, rounds: int | None = None) -> list[BenchRecord]:
    servers, workers = (1, 1) if quick else (2, 2)
    rounds = rounds or (2 if quick else 5)
    ways = ("fork_server", "fresh", "zygote")
    best = {way: [float("inf"), float("inf")] for way in ways}
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-launch-") as tmp:
        folder = Path(tmp)
        (folder / "job.py").write_text(JOB)
        try:
            _warm_zygotes(folder, servers, workers)
            for _ in range(rounds):
                for way in ways:
                    cpu, wall = _launch(folder, servers, workers, way)
                    best[way][0] = min(best[way][0], cpu)
                    best[way][1] = min(best[way][1], wall)
        finally:
            shutil.rmtree(folder / "zygotes", ignore_errors=True)  # stops the zygotes
    params = {
        "servers": servers,
        "workers": workers,
        "rounds": rounds,
        "baseline": "every child a fresh interpreter (SPARSEPS_FORK_SERVER=0)",
        "cpus": os.cpu_count(),
    }
    zygote_params = {**params, "baseline": "the launcher's own fork server (no zygotes)"}
    fork, fresh, zygote = (best[way] for way in ways)
    return [
        BenchRecord("job_start_cpu_s", fork[0], "s", fresh[0], params),
        BenchRecord("job_start_wall_s", fork[1], "s", fresh[1], params),
        BenchRecord("zygote_job_start_cpu_s", zygote[0], "s", fork[0], zygote_params),
        BenchRecord("zygote_job_start_wall_s", zygote[1], "s", fork[1], zygote_params),
    ]
