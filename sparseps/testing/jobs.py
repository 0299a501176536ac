"""Run ``sparseps launch`` jobs from a test, find their processes, wait on a condition.

The suite's one home for the helpers its job tests share (the launcher, heter, replica,
security and recall tests start real jobs with them); :func:`sparseps.testing.wait_until`
waits for what the job does.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..rpc import port_claims, transport
from .environ import CHECKOUT, clean_environ
from .wait import wait_until

__all__ = [
    "MINIMAL",
    "alive",
    "assert_all_gone",
    "can_bind",
    "clean_env",
    "finish",
    "free_port",
    "free_port_pair",
    "job_processes",
    "launch_argv",
    "processes_with",
    "read_pids",
    "results",
    "run_launch",
    "start_two_launchers",
    "text",
    "two_nodes",
]

# the checkout's smallest example job (examples/minimal/train.py)
MINIMAL = CHECKOUT / "examples" / "minimal" / "train.py"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment for a job (:func:`sparseps.testing.environ.clean_environ`), plus extra."""
    return clean_environ(**extra)


def launch_argv(*args: str) -> list[str]:
    """``sparseps launch ARGS`` (the console script's entry point, run with this interpreter)."""
    return [sys.executable, "-m", "sparseps.cli", "launch", *args]


def run_launch(
    *args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
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
    return processes_with(f"SPARSEPS_JOB_ID={job_id}".encode() + b"\0", "environ")


def processes_with(needle: bytes, part: str = "cmdline") -> list[int]:
    """Live processes whose ``/proc/PID/<part>`` (``cmdline`` or ``environ``: NUL-separated,
    one NUL added at the end) holds ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / part).read_bytes() + b"\0"
        except OSError:
            continue
        if needle in text and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def read_pids(log_dir: Path) -> dict[str, Any]:
    """The launcher's record of its job's processes (``LOG_DIR/pids.json``)."""
    record: dict[str, Any] = json.loads((log_dir / "pids.json").read_text())
    return record


def free_port(host: str = "127.0.0.1") -> int:
    return transport.free_port(host)  # drawn outside the ephemeral range (see there)


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port P with P and P+1 free (the rendezvous and the launchers' control store)."""
    for _ in range(50):
        port = free_port(host)
        try:
            with socket.socket() as s:
                s.bind((host, port + 1))
        except OSError:
            continue
        if port_claims.claims.claim(port + 1):  # P is claimed; P+1 too, or draw again
            return port
    raise AssertionError("no free pair of ports")


def can_bind(host: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


def results(folder: Path, count: int) -> list[dict[str, Any]]:
    """The ``worker.R.json`` records the job scripts write, rank order."""
    return [json.loads((folder / f"worker.{r}.json").read_text()) for r in range(count)]


def assert_all_gone(log_dir: Path, within: float = 5.0) -> dict[str, Any]:
    """Every pid the launcher recorded (its fork server too) exits within ``within`` s;
    none of the job is left."""
    record = read_pids(log_dir)
    pids = [c["pid"] for c in record["children"]] + record.get("fork_servers", [])
    wait_until(lambda: not any(alive(p) for p in pids), within, f"children {pids} to exit")
    assert job_processes(record["job_id"]) == []
    return record


def text(path: Path) -> str:
    """The file's text; empty while it does not exist yet."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def two_nodes() -> tuple[str, str]:
    """Two "node" addresses on loopback: Linux routes all of 127/8 to lo; where 127.0.0.2
    cannot be bound, a second name for loopback still gives two distinct nodes."""
    return "127.0.0.1", ("127.0.0.2" if can_bind("127.0.0.2") else "localhost")


def start_two_launchers(
    tmp_path: Path, script: Path, *args: str, options: tuple[str, ...] = ()
) -> list[tuple[str, Path, subprocess.Popen[str]]]:
    """Start one launcher per node (1 server + 1 worker each; worker 1 on the second node).

    Returns ``[(host, log_dir, Popen)]``; the node hosting the control store starts last,
    so the other has to wait for it.
    """
    a, b = two_nodes()
    master = free_port_pair(a)
    common = [
        "--servers", f"{a}:{free_port(a)},{b}:{free_port(a if b == 'localhost' else b)}",
        "--workers", f"{a},{b}", "--master", f"{a}:{master}", *options,
    ]  # fmt: skip
    started = []
    for host in (b, a):
        log_dir = tmp_path / f"log-{host}"
        argv = launch_argv(*common, "--host", host, "--log-dir", str(log_dir), str(script), *args)
        proc = subprocess.Popen(
            argv, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        started.append((host, log_dir, proc))
    return started[::-1]


def finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
    """Wait for every process (bounded); kill any still running. Returns their outputs."""
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outputs
