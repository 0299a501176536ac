"""This node's child processes: how one starts, where its output goes, what is recorded.

:class:`~sparseps.launch.supervisor.Supervisor` decides *when* a process starts, stops
or fails the job; this module does the starting and the bookkeeping every such decision
leaves behind, the same for servers, workers and heter workers:

- every child runs in its own session, so a signal to its process group reaches
  anything it spawned; on Linux it also gets SIGTERM if the launcher dies;
- a child is forked by the launcher's fork server when it can be
  (:mod:`~sparseps.launch.fork_server`: its imports are done), else started as a fresh
  interpreter;
- a child's stdout+stderr go to ``LOG_DIR/{role}.{rank}.log`` (worker 0's also to the
  console) through one pump thread per child, which also notes when it last wrote (the
  "no output for N s" warning the supervisor gives);
- ``LOG_DIR/pids.json`` lists every process started (restarts included, and the fork
  server) so that tools and tests can check that none survives the job; each entry also
  names the port of its ``/metrics`` (``metrics_port``, when metrics are on), and
  ``extra_record`` adds the launcher's own ports (``launcher_metrics_port``,
  ``status_port``);
- :meth:`Children.roles` is what the status page shows, and keeps
  ``sparseps_launcher_role_up`` current.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.atomic_file import replaced_atomically
from ..env import RESTART_COUNT, Role
from .fork_server import ForkedProcess, ForkServer
from .procutil import die_with_parent_hook
from .records import ChildSpec

__all__ = ["Child", "Children"]

log = logging.getLogger(__name__)


@dataclass
class Child:
    """One started process and what the supervision loop learnt about it."""

    spec: ChildSpec
    proc: subprocess.Popen[bytes] | ForkedProcess
    attempt: int
    pump: threading.Thread
    last_output: float
    warned_at: float = 0.0
    exit_code: int | None = None
    note: str = ""  # why its exit fails the job, when that is not the usual reason


class Children:
    """The processes this node started, running or exited (module docstring).

    Args:
        lock: the supervisor's lock (reentrant): a scale request's thread starts
            processes beside the supervision loop.
        pids_path: where the pid list goes (None: nowhere).
        job_id: recorded in the pid list.
        extra_record: more top-level fields of the pid list.
    """

    def __init__(
        self,
        lock: threading.RLock,
        pids_path: Path | None,
        job_id: str,
        extra_record: Mapping[str, object],
    ) -> None:
        from ..observe.registry import launcher_metrics

        self._metrics = launcher_metrics()
        self._lock = lock
        self._pids_path = pids_path
        self._job_id = job_id
        self._extra_record = extra_record
        self.running: list[Child] = []  # in start order; the supervisor drops replaced ones
        self._history: list[dict] = []
        self.fork_server: ForkServer | None = None  # set by the supervisor's run

    def start(self, spec: ChildSpec, attempt: int) -> Child:
        """Start ``spec`` as restart generation ``attempt`` (workers get it as
        ``SPARSEPS_RESTART_COUNT``) with its log pump, and record it."""
        with self._lock:
            return self._start_locked(spec, attempt)

    def _start_locked(self, spec: ChildSpec, attempt: int) -> Child:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab") as f:
            if attempt:  # the worker group's restart generation
                f.write(f"\n----- restart attempt {attempt} -----\n".encode())
        env = dict(spec.env)
        if spec.role is Role.WORKER:  # the worker group's generation (env.RESTART_COUNT)
            env[RESTART_COUNT] = str(attempt)
        proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        forks = self.fork_server
        if forks is not None and forks.serves(spec.argv, env):
            proc = forks.spawn(spec.argv, env, torch=spec.imports_torch)
        if proc is None:
            proc = subprocess.Popen(
                list(spec.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: signals reach its whole tree
                preexec_fn=die_with_parent_hook(),
            )
        child = Child(spec, proc, attempt, threading.Thread(), time.monotonic())
        child.pump = threading.Thread(
            target=_pump, args=(child,), name=f"log-{spec.role.value}-{spec.rank}", daemon=True
        )
        child.pump.start()
        self.running.append(child)
        record: dict = {"role": spec.role.value, "rank": spec.rank, "pid": proc.pid}
        record["attempt"] = attempt
        if spec.metrics_port is not None:
            record["metrics_port"] = spec.metrics_port
        self._history.append(record)
        self._metrics.role_up.labels(spec.role.value, str(spec.rank)).set(1)
        self._write_pids()
        log.debug("started %s (pid %d, attempt %d)", spec.name, proc.pid, attempt)
        return child

    def _write_pids(self) -> None:
        if self._pids_path is None:
            return
        record = {
            "job_id": self._job_id,
            "launcher": os.getpid(),
            **({"fork_servers": self.fork_server.pids} if self.fork_server else {}),
            **self._extra_record,
            "children": self._history,
        }
        with self._lock, replaced_atomically(self._pids_path) as tmp:
            tmp.write_text(json.dumps(record, indent=1))

    def worker_env(self) -> dict[str, str]:
        """The environment of a running worker of the current generation (empty if none)."""
        for child in reversed(list(self.running)):
            if child.spec.role is Role.WORKER and child.proc.poll() is None:
                return dict(child.spec.env)
        return {}

    def roles(self) -> list[dict]:
        """Every role of this node as it stands now (the status page's rows): role, rank,
        pid, attempt, ``alive``, ``exit_code`` (None while running), log path and
        metrics port. Safe to call from another thread."""
        out = []
        for child in list(self.running):
            code = child.proc.returncode if child.exit_code is None else child.exit_code
            self._metrics.role_up.labels(child.spec.role.value, str(child.spec.rank)).set(
                1 if code is None else 0
            )
            out.append(
                {
                    "role": child.spec.role.value,
                    "rank": child.spec.rank,
                    "pid": child.proc.pid,
                    "attempt": child.attempt,
                    "alive": code is None,
                    "exit_code": code,
                    "log_path": str(child.spec.log_path),
                    "metrics_port": child.spec.metrics_port,
                }
            )
        return out

    def newly_quiet(self, limit: float) -> list[tuple[Child, float]]:
        """The running children that have written nothing for ``limit`` seconds, with how
        long, each again every ``limit`` (the supervisor warns: a hung process shows
        before any timeout)."""
        now, out = time.monotonic(), []
        for child in self.running:
            if child.exit_code is not None:
                continue
            quiet = now - child.last_output
            if quiet > limit and now - child.warned_at > limit:
                child.warned_at = now
                out.append((child, quiet))
        return out


def _pump(child: Child) -> None:
    """Copy the child's output to its log (and the console for worker 0)."""
    stdout = child.proc.stdout
    assert stdout is not None  # started with stdout=PIPE
    fd = stdout.fileno()
    console = sys.stdout.buffer if child.spec.echo else None
    with open(child.spec.log_path, "ab") as logfile:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            child.last_output = time.monotonic()
            logfile.write(chunk)
            logfile.flush()
            if console is not None:
                try:
                    console.write(chunk)
                    console.flush()
                except (OSError, ValueError):
                    console = None  # console closed; the log still has everything
    stdout.close()
