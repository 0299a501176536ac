"""Helpers for the launcher tests: run ``sparseps launch``, find a job's processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
JOB = SCRIPTS / "job.py"
MINIMAL = ROOT / "examples" / "minimal" / "train.py"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without SPARSEPS_* variables (tests may run inside a job), plus extra.

    The repository root leads PYTHONPATH so that children import this checkout's sparseps
    whatever their working directory.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def launch_argv(*args: str) -> list[str]:
    """``sparseps launch ARGS`` (the console script's entry point, run with this interpreter)."""
    return [sys.executable, "-m", "sparseps.cli", "launch", *args]


def run_launch(*args: str, cwd: Path, timeout: float = 120, env: dict | None = None):
    """Run ``sparseps launch ARGS`` to completion; returns the CompletedProcess."""
    return subprocess.run(
        launch_argv(*args),
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie counts as gone: it is only waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def job_processes(job_id: str) -> list[int]:
    """Live processes whose environment carries ``SPARSEPS_JOB_ID=job_id``."""
    needle = f"SPARSEPS_JOB_ID={job_id}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes() + b"\0"
        except OSError:
            continue
        if needle in environ and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def read_pids(log_dir: Path) -> dict:
    return json.loads((log_dir / "pids.json").read_text())


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P with P and P+1 free (the rendezvous and the launchers' control store)."""
    for _ in range(50):
        port = free_port(host)
        try:
            with socket.socket() as s:
                s.bind((host, port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no free pair of ports")


def can_bind(host: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False
