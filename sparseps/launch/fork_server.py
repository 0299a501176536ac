"""Start the launcher's children by forking a process that has already imported the
libraries every role imports, instead of starting a fresh interpreter for each.

A fresh worker spends about 3 CPU-seconds importing torch, numpy, numba and pyarrow
before it runs a line of the job's script (a server about 1.3 without torch); on the
2-core machines we test on, that was half of what a small job cost, and it is paid again
on every restart of the worker group. The fork server imports them once per launcher:

- it starts with the job's environment (what every child gets, less the role variables)
  and imports the *server* set: numpy, numba, pyarrow, zmq and sparseps' server and data
  modules; servers are forked from it while it holds nothing more;
- the first worker (or heter worker) adds torch and the worker modules; a server asked
  for after that starts as a fresh interpreter, so that a server's memory never carries
  torch's 130 MB it would not have imported;
- before each fork it loads the sparseps kernels that numba's cache holds and it has not
  loaded yet (:func:`sparseps.core.jit.load_cached_kernels`): a child finds them loaded
  instead of loading each on its first call; and it freezes its objects (``gc.freeze``)
  so that no child's garbage collection walks them;
- a child runs exactly what ``python -u -m sparseps.observe.child ARGS`` runs, in its own
  session, with its own environment and folder, stdout+stderr into the pipe the launcher
  reads, and SIGTERM when the fork server dies (which dies with the launcher: the chain
  every child has without it). Its random generators are seeded afresh;
- a child whose environment differs from the fork server's anywhere but in the role
  variables (``SPARSEPS_*``, Paddle's), whose interpreter options differ, or that the fork
  server cannot start, starts as a fresh interpreter: what Python or a library reads at
  import time is then always what the child would have read itself.

``SPARSEPS_FORK_SERVER=0`` turns it off (every child a fresh interpreter).

:func:`sparseps.testing.local_cluster` uses them too (shared by the clusters of a process,
one per environment, :meth:`ForkServer.spawn_module`): its servers are ``python -m
sparseps.server`` with their stderr in a log file, forked the same way.

Requests and reports are JSON messages over a Unix ``SOCK_SEQPACKET`` pair; the pipe's
write end travels with the request (``SCM_RIGHTS``). The fork server is single-threaded
(a child is forked from the thread that reads the requests) and reaps its children,
reporting each exit code as :class:`subprocess.Popen` would give it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from ..env import FORK_SERVER
from .procutil import die_with_parent, die_with_parent_hook

__all__ = ["ForkServer", "ForkedProcess", "fork_server_enabled"]

log = logging.getLogger(__name__)

# the interpreter prefix of every launched child (launch_cli._child); what follows it are
# the arguments of sparseps.observe.child
CHILD_PREFIX = ("-u", "-m", "sparseps.observe.child")
SERVER_SET = (
    "numpy",
    "numba",
    "zmq",
    "pyarrow",
    "pyarrow.csv",
    "sparseps.observe.child",
    "sparseps.role",
    "sparseps.server",
    "sparseps.data",
)
WORKER_SET = ("torch", "sparseps.worker", "sparseps.models")
_ENTRY = "from sparseps.launch.fork_server import main; main()"
_MAX_MESSAGE = 1 << 20
_START_TIMEOUT_S = 120.0  # the fork server's own imports, on a loaded machine


def fork_server_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether launchers fork their children (``SPARSEPS_FORK_SERVER``, on by default)."""
    value = (os.environ if environ is None else environ).get(FORK_SERVER, "1").strip()
    return value not in ("0", "false", "no", "off")


def _per_child(name: str) -> bool:
    """Whether a variable may differ between children of one fork server: the role
    variables, which nothing reads at import time, and pytest's name of the running test
    (it changes with every test of a process that starts local clusters)."""
    return name.startswith(("SPARSEPS_", "PADDLE_")) or name in (
        "TRAINING_ROLE",
        "POD_IP",
        "PYTEST_CURRENT_TEST",
    )


def _shared(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not _per_child(k)}


class ForkedProcess:
    """A child started by the fork server: the part of :class:`subprocess.Popen` the
    launcher uses (``pid``, ``stdout``, ``returncode``, ``poll``, ``wait``, signals)."""

    def __init__(self, pid: int, stdout) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's side of one fork server (module docstring).

    Args:
        env: the environment the children will have, role variables aside (any child's).
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = _shared(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _MAX_MESSAGE)
        self._sock = ours
        self._proc = subprocess.Popen(
            # -c, not -m: the package sparseps.launch has imported this module already
            [sys.executable, "-u", "-c", _ENTRY, str(theirs.fileno())],
            env=self._env,
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,  # a Ctrl-C to the launcher's group is the launcher's
            preexec_fn=die_with_parent_hook(),
        )
        theirs.close()
        self._lock = threading.Lock()  # one request on the socket at a time
        self._replies: dict[int, dict] = {}
        self._reply = threading.Condition()
        self._next_id = 0
        self._children: dict[int, ForkedProcess] = {}
        self._exits: dict[int, int] = {}  # exits reported before the launcher saw the pid
        self._ready: set[str] = set()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def serves(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether a child with this command line and environment can be forked."""
        return (
            not self._closed
            and len(argv) > len(CHILD_PREFIX)
            and argv[0] == sys.executable
            and tuple(argv[1 : 1 + len(CHILD_PREFIX)]) == CHILD_PREFIX
            and self.serves_env(env)
        )

    def serves_env(self, env: Mapping[str, str]) -> bool:
        """Whether a child with this environment can be forked (:meth:`spawn_module`)."""
        return not self._closed and _shared(env) == self._env

    def spawn_module(
        self, module: str, args: Sequence[str], env: Mapping[str, str], *, stdout: int, stderr: int
    ) -> ForkedProcess | None:
        """Fork a child running what ``python -m MODULE ARGS`` runs, with ``env`` (see
        :meth:`serves_env`) and its output into the file descriptors ``stdout`` and
        ``stderr`` (the caller's, still open after the call); never torch. None when the
        fork server cannot: start it as a fresh interpreter then."""
        message = {
            "module": module, "argv": list(args), "env": dict(env), "cwd": os.getcwd(),
            "torch": False,
        }  # fmt: skip
        return self._started(self._request(message, [stdout, stderr]), None)

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], *, torch: bool
    ) -> ForkedProcess | None:
        """Fork a child running ``argv`` (a launched child's command line, see
        :meth:`serves`) with ``env``; ``torch``: it will import torch (a worker). None when
        the fork server cannot (dead, or holding torch for a child that would not import
        it): start the child as a fresh interpreter then."""
        read_end, write_end = os.pipe()
        try:
            reply = self._request(
                {
                    "argv": list(argv[1 + len(CHILD_PREFIX) :]),
                    "env": dict(env),
                    "cwd": os.getcwd(),
                    "torch": torch,
                },
                [write_end],
            )
        finally:
            os.close(write_end)
        proc = self._started(reply, read_end)
        if proc is None:
            os.close(read_end)
        return proc

    def _started(self, reply: dict | None, read_end: int | None) -> ForkedProcess | None:
        """The handle of the child a reply names (``read_end``: its output pipe, opened only
        then), or None."""
        if reply is None or "pid" not in reply:
            if reply is not None and reply.get("error"):
                log.warning("fork server: %s; starting a fresh interpreter", reply["error"])
            return None
        # the pipe is closed by the launcher's log pump
        stdout = None if read_end is None else open(read_end, "rb", buffering=0)  # noqa: SIM115
        proc = ForkedProcess(reply["pid"], stdout)
        with self._reply:
            self._children[proc.pid] = proc
            if proc.pid in self._exits:
                proc._set_exit(self._exits.pop(proc.pid))
        return proc

    def _request(self, message: dict, fds: list[int]) -> dict | None:
        with self._lock:
            if self._closed:
                return None
            self._next_id += 1
            message_id = self._next_id
            data = json.dumps({"id": message_id, **message}).encode()
            if len(data) > _MAX_MESSAGE // 2:  # an environment of megabytes: start it fresh
                return None
            try:
                socket.send_fds(self._sock, [data], fds)
            except OSError:
                return None
        with self._reply:
            self._reply.wait_for(
                lambda: message_id in self._replies or self._closed, timeout=_START_TIMEOUT_S
            )
            return self._replies.pop(message_id, None)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._reply:
                if "exited" in message:
                    pid, code = message["exited"], message["code"]
                    if pid in self._children:
                        self._children.pop(pid)._set_exit(code)
                    else:
                        self._exits[pid] = code
                else:
                    self._replies[message["id"]] = message
                self._reply.notify_all()
        # the fork server is gone; its children got SIGTERM from the kernel
        with self._reply:
            if not self._closed:
                log.warning(
                    "fork server (pid %d) exited%s; children start as fresh interpreters",
                    self._proc.pid,
                    f", stopping its {len(self._children)} children" if self._children else "",
                )
            self._closed = True
            for proc in self._children.values():
                proc._set_exit(-signal.SIGTERM)
            self._children.clear()
            self._reply.notify_all()

    def close(self) -> None:
        """Stop the fork server (its children still running get SIGTERM from the kernel:
        call this once they are stopped)."""
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5.0)
        self._sock.close()


# -- the fork server process -----------------------------------------------------------


def _import_all(names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(ImportError):  # an optional extra: the child will say
            importlib.import_module(name)


def _serve(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """Fork children until the launcher closes the socket; returns (the request, its
    output fds: one for stdout and stderr, or one each) in a forked child, None in the
    fork server when done."""
    from ..core.jit import load_cached_kernels  # numba: the fork server's imports have it

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    has_torch = False

    def send(message: dict) -> None:
        with contextlib.suppress(OSError):
            sock.send(json.dumps(message).encode())

    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        if sock.fileno() not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            return None
        request = json.loads(data)
        if not fds:
            send({"id": request["id"], "error": "no output pipe came with the request"})
            continue
        if request["torch"] and not has_torch:
            _import_all(WORKER_SET)
            has_torch = True
        elif not request["torch"] and has_torch:
            _close_all(fds)
            send({"id": request["id"]})  # a fresh interpreter keeps a server torch-free
            continue
        load_cached_kernels()  # what other processes have compiled since: once, here
        # Everything the fork server holds moves to the collector's permanent generation:
        # a child's collections (and its exit's) never walk the inherited objects, nor
        # write to their pages. A server's exit took ~0.5 CPU-s without it, 0.1 with it.
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            _close_all(fds)
            send({"id": request["id"], "error": f"fork failed: {exc}"})
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w):
                os.close(fd)
            sock.close()
            return request, fds
        _close_all(fds)
        send({"id": request["id"], "pid": pid})


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def _become(request: dict, out_fds: list[int], server_pid: int) -> None:
    """In a forked child: turn into the requested child and run it (module docstring)."""
    import random

    os.setsid()
    die_with_parent(server_pid)
    os.dup2(out_fds[0], 1)
    os.dup2(out_fds[-1], 2)
    _close_all(out_fds)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh interpreter's generators differ between processes
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "module" in request:  # as ``python -m MODULE ARGS``: sys.path[0] is the folder
        sys.argv = [sys.argv[0], *request["argv"]]
        sys.path[0] = os.getcwd()
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return
    from ..observe.child import main

    main(request["argv"])


def main() -> None:
    """The fork server process (``python -c _ENTRY FD``: FD is its end of the socket)."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    _import_all(SERVER_SET)
    server_pid = os.getpid()
    job = _serve(sock)
    if job is not None:
        _become(*job, server_pid)
