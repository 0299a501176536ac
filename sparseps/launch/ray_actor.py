"""One role of a ``sparseps launch --backend ray`` job: a Ray actor that runs the script.

The driver (``ray_backend.py``) creates one :class:`RoleActor` per server and worker in
a placement group. The actor runs on its node and owns one child process there:

- :meth:`RoleActor.prepare` checks that the paths the role needs exist on this node (the
  script, the working folder, ``--file-root`` folders, the key folder) and picks the
  ports the role listens on, on this node's address: the ports are chosen where they are
  bound, and the driver gathers them through Ray;
- :meth:`RoleActor.start` runs ``python -u -m sparseps.observe.child SCRIPT ARGS`` with
  the environment the driver computed (the same contract as the local launcher), in its
  own session, its output appended to a node-local log file;
- :meth:`RoleActor.poll` returns the exit code (None while running) and the log bytes
  written since ``offset``, which the driver appends to ``LOG_DIR/{role}.{rank}.log`` on
  its machine (the bytes also go to the actor's stdout, i.e. Ray's own worker logs);
- :meth:`RoleActor.stop` ends the child's process group (SIGTERM, SIGKILL after a grace).

Nothing outlives the actor: the child asks the kernel for SIGTERM when the actor dies
(``PR_SET_PDEATHSIG``; Ray runs a plain actor's methods on its main thread, the thread
that forks), and an exit hook kills the child's process group when the actor exits
normally. Ray ends a non-detached actor when the driver that made it exits or is killed.

Every method returns quickly (the driver polls), so the actor needs one thread only.
The class is plain Python: the driver wraps it with ``ray.remote`` and the tests can
run it in process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..rpc import transport
from .procutil import die_with_parent_hook, signal_groups

__all__ = ["MAX_CHUNK", "RoleActor"]

# At most this many log bytes per poll: a chatty role cannot make one reply huge.
MAX_CHUNK = 1 << 20


def _node_address() -> str:
    """This node's address as Ray knows it (outside Ray: the loopback address)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:  # pragma: no cover - the actor always runs under Ray
        pass
    return "127.0.0.1"


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except ImportError:  # pragma: no cover
        pass
    return socket.gethostname()


def _niceness(pid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


def _node_niceness() -> int | None:
    """The niceness of the process that started this actor (Ray's raylet, normally 0).

    Ray runs its workers, and so this actor, at ``worker_niceness`` (15 by default) so
    that they yield to Ray's own processes; a role inheriting that would get a fraction
    of the CPU the local launcher's roles get on a busy machine.
    """
    return _niceness(os.getppid())


def _child_setup(nice: int | None):
    """The child's ``preexec_fn``: die with this actor, and run at Ray's own niceness
    where allowed (lowering niceness needs CAP_SYS_NICE; else it stays, and the log
    says so)."""
    die_with_parent = die_with_parent_hook()

    def setup() -> None:
        if die_with_parent is not None:
            die_with_parent()
        if nice is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, nice)

    return setup


class RoleActor:
    """Runs one role's process on the node Ray placed it on.

    Args:
        role: ``server`` or ``worker``.
        rank: rank within the role.
        job_id: the job's id (names the node-local log folder).
    """

    def __init__(self, role: str, rank: int, job_id: str) -> None:
        self.role, self.rank, self.job_id = role, rank, job_id
        self.host = _node_address()
        folder = Path(tempfile.gettempdir()) / "sparseps-ray" / job_id
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / f"{role}.{rank}.log"
        self.log_path.unlink(missing_ok=True)  # a job id given again: only this run's output
        self._proc: subprocess.Popen[bytes] | None = None
        atexit.register(self._kill_group)

    # -- placement ------------------------------------------------------------------------
    def prepare(self, paths: Mapping[str, str], ports: int) -> dict:
        """Check ``paths`` (what -> path) exist here and pick ``ports`` free ports.

        Returns:
            ``{"host", "node_id", "hostname", "ports", "error"}``; ``error`` names this
            node and the first missing path ("" when all are there).
        """
        error = ""
        for what, path in paths.items():
            if path and not os.path.exists(path):
                error = (
                    f"{what} {path} does not exist on node {self.host} "
                    f"({socket.gethostname()}) where {self.role} {self.rank} runs: every node "
                    "needs it at the same path (a shared filesystem, or copy it there)"
                )
                break
        return {
            "host": self.host,
            "node_id": _node_id(),
            "hostname": socket.gethostname(),
            "ports": self.free_ports(ports) if not error else [],
            "error": error,
        }

    def free_ports(self, count: int) -> list[int]:
        """``count`` distinct ports free on this node's address right now."""
        return transport.free_ports(self.host, count)

    # -- the child ------------------------------------------------------------------------
    def start(
        self, args: Sequence[str], env: Mapping[str, str], *, cwd: str, attempt: int = 0
    ) -> int:
        """Start ``python -u -m sparseps.observe.child ARGS`` with ``env``; returns its pid.

        ``env`` holds the role's variables and the driver's choices; the rest comes from
        this node's environment (:func:`sparseps.env.child_environ`). ``OMP_NUM_THREADS``
        that Ray sets for its workers is dropped unless the driver passes one, so that a
        role uses the threads it would get from the local launcher.
        """
        from ..env import child_environ

        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"{self.role} {self.rank}: a process is still running")
        full = child_environ(env)
        if "OMP_NUM_THREADS" not in env:
            full.pop("OMP_NUM_THREADS", None)
        argv = [sys.executable, "-u", "-m", "sparseps.observe.child", *args]
        nice = _node_niceness()
        with open(self.log_path, "ab") as log:
            if attempt:
                log.write(f"\n----- restart attempt {attempt} -----\n".encode())
                log.flush()
            self._proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_child_setup(nice),  # noqa: PLW1509 - two system calls
            )
            got = _niceness(self._proc.pid)
            if nice is not None and got is not None and got > nice:
                log.write(
                    f"sparseps: this {self.role} runs at nice {got} (Ray's worker_niceness), "
                    f"not {nice} like Ray itself, and may get less CPU than other work; start "
                    "Ray with RAY_worker_niceness=0 in its environment to avoid this\n".encode()
                )
        return self._proc.pid

    def poll(self, offset: int) -> dict:
        """The child's exit code (None while it runs) and its log bytes from ``offset``.

        The exit code is read first, so a final reply holds everything it wrote.
        """
        code = None if self._proc is None else self._proc.poll()
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read(MAX_CHUNK)
        except OSError:
            data = b""
        if data:  # Ray's own log of this actor gets the role's output too
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        more = len(data) == MAX_CHUNK
        return {
            "code": code,
            "data": data,
            "offset": offset + len(data),
            "more": more,
            "pid": None if self._proc is None else self._proc.pid,
        }

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the child's process group, SIGKILL after ``grace_s``; its exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            signal_groups([proc.pid], signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        self._kill_group()
        try:
            return proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
            return None

    def _kill_group(self) -> None:
        # also when the leader exited: what it started must not outlive the job
        if self._proc is not None:
            signal_groups([self._proc.pid], signal.SIGKILL)
