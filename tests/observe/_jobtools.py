"""Helpers of the observability tests: start ``sparseps launch`` in the background."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sparseps.testing import wait_until
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def clean_env() -> dict[str, str]:
    """This environment without SPARSEPS_* variables, with this checkout first on the path."""
    return clean_environ()


def start_launch(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sparseps.cli", "launch", *args],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    """Poll ``predicate`` until truthy; fails naming ``what`` (and the launcher's output)."""

    def check():
        value = predicate()
        if not value and proc is not None and proc.poll() is not None:
            raise AssertionError(f"launcher exited {proc.returncode} waiting for {what}:\n"
                                 f"{proc.stdout.read()[-4000:] if proc.stdout else ''}")  # fmt: skip
        return value

    return wait_until(check, timeout, what, interval=0.1)


def read_pids(log_dir: Path) -> dict:
    return json.loads((log_dir / "pids.json").read_text())


def finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    """Wait for the launcher to exit; stops it (SIGTERM, then SIGKILL) if it does not."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    return out or ""
