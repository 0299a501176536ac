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
  torch's 130 MB it would not have imported. A server whose script imports torch at its
  top level before it asks for its role (:func:`script_imports_torch`) would import it
  anyway: it is forked with torch loaded, like a worker;
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

``SPARSEPS_FORK_SERVER=0`` turns it off (every child a fresh interpreter). With
``SPARSEPS_ZYGOTE_DIR``, the fork servers are forked, already imported, by zygotes kept
warm between jobs (:mod:`sparseps.launch.zygote`). This module is the launcher's side; the
fork server process is :mod:`sparseps.launch.fork_process`.

:func:`sparseps.testing.local_cluster` uses them too (shared by the clusters of a process,
one per environment, :meth:`ForkServer.spawn_module`): its servers are ``python -m
sparseps.server`` with their stderr in a log file, forked the same way.

Requests and reports are JSON messages over a Unix ``SOCK_SEQPACKET`` pair; the pipe's
write end travels with the request (``SCM_RIGHTS``). The fork server is single-threaded
(a child is forked from the thread that reads the requests) and reaps its children,
reporting each exit code as :class:`subprocess.Popen` would give it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from ..core.closing import Closing
from ..env import settings
from .fork_process import MAX_MESSAGE as _MAX_MESSAGE
from .fork_process import WORKER_SET
from .procutil import die_with_parent_hook
from .zygote import Zygotes

__all__ = ["ForkServer", "ForkedProcess", "fork_server_enabled", "script_imports_torch"]

log = logging.getLogger(__name__)

# the interpreter prefix of every launched child (launch_cli._child); what follows it are
# the arguments of sparseps.observe.child
CHILD_PREFIX = ("-u", "-m", "sparseps.observe.child")
_ENTRY = "from sparseps.launch.fork_process import main; main()"
_START_TIMEOUT_S = 120.0  # the fork server's own imports, on a loaded machine


def fork_server_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether launchers fork their children (``SPARSEPS_FORK_SERVER``, on by default)."""
    return settings(environ).fork_server


# Modules whose import brings torch in: a script importing one at its top level imports
# torch on every role, servers too.
_TORCH_MODULES = (*WORKER_SET, "sparseps.nn", "sparseps.core.collectives")
_ROLE_CHECKS = ("is_server", "run_server", "is_worker")


@functools.lru_cache(maxsize=64)
def script_imports_torch(path: str) -> bool:
    """Whether the script at ``path`` imports torch (or a sparseps module that does) at its
    top level before its first statement that asks for the role (``is_server``,
    ``run_server``; a function's body does not count): then its servers import torch as
    well, and are better forked from the fork server that holds it (no ~1.4 CPU-s import
    each, and the pages shared) than from the one without. Static (the script is not
    run); False when it cannot be read or parsed: its servers then start as they would."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and any(
            (isinstance(n, ast.Name) and n.id in _ROLE_CHECKS)
            or (isinstance(n, ast.Attribute) and n.attr in _ROLE_CHECKS)
            for n in ast.walk(node)
        ):
            return False  # a server may leave from here on
        for inner in ast.walk(node) if isinstance(node, ast.Try) else (node,):
            if isinstance(inner, ast.Import):
                names = [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom) and not inner.level and inner.module:
                names = [inner.module, *(f"{inner.module}.{a.name}" for a in inner.names)]
            else:
                continue
            if any(n == m or n.startswith(m + ".") for n in names for m in _TORCH_MODULES):
                return True
    return False


def _per_child(name: str) -> bool:
    """Whether a variable may differ between children of one fork server: the role
    variables, which nothing reads at import time, and pytest's names of the running test
    (it changes with every test of a process that starts local clusters) and of the xdist
    worker (so that a suite's workers share their zygotes)."""
    return name.startswith(("SPARSEPS_", "PADDLE_")) or name in (
        "TRAINING_ROLE",
        "POD_IP",
        "PYTEST_CURRENT_TEST",
        "PYTEST_XDIST_WORKER",
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


class _Channel:
    """The socket to one fork server process, and the children it reports on."""

    def __init__(self, sock: socket.socket, pid: int, proc: subprocess.Popen | None) -> None:
        self.sock = sock
        self.pid = pid
        self._proc = proc  # None for a fork server a zygote forked (not our child)
        self._lock = threading.Lock()  # one request on the socket at a time
        self._replies: dict[int, dict] = {}
        self._reply = threading.Condition()
        self._next_id = 0
        self._children: dict[int, ForkedProcess] = {}
        self._exits: dict[int, int] = {}  # exits reported before the launcher saw the pid
        self.closed = False
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    def started(self, reply: dict | None, read_end: int | None) -> ForkedProcess | None:
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

    def request(self, message: dict, fds: list[int]) -> dict | None:
        with self._lock:
            if self.closed:
                return None
            self._next_id += 1
            message_id = self._next_id
            data = json.dumps({"id": message_id, **message}).encode()
            if len(data) > _MAX_MESSAGE // 2:  # an environment of megabytes: start it fresh
                return None
            try:
                socket.send_fds(self.sock, [data], fds)
            except OSError:
                return None
        with self._reply:
            self._reply.wait_for(
                lambda: message_id in self._replies or self.closed, timeout=_START_TIMEOUT_S
            )
            return self._replies.pop(message_id, None)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(_MAX_MESSAGE)
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
            if not self.closed:
                log.warning(
                    "fork server (pid %d) exited%s; children start as fresh interpreters",
                    self.pid,
                    f", stopping its {len(self._children)} children" if self._children else "",
                )
            self.closed = True
            for proc in self._children.values():
                proc._set_exit(-signal.SIGTERM)
            self._children.clear()
            self._reply.notify_all()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
        # it exits on the end of its socket (and a zygote, its parent, reaps it)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(timeout=5.0)
        if self._proc is None and self._reader.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._reader.join(timeout=5.0)
        self.sock.close()


def _fresh_channel(env: Mapping[str, str]) -> _Channel:
    """A fork server started as a fresh interpreter with ``env``, child of this process."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _MAX_MESSAGE)
    proc = subprocess.Popen(
        # -c, not -m: the package sparseps.launch has imported this module already
        [sys.executable, "-u", "-c", _ENTRY, str(theirs.fileno())],
        env=env,
        stdin=subprocess.DEVNULL,
        pass_fds=(theirs.fileno(),),
        start_new_session=True,  # a Ctrl-C to the launcher's group is the launcher's
        preexec_fn=die_with_parent_hook(),
    )
    theirs.close()
    return _Channel(ours, proc.pid, proc)


class ForkServer(Closing):
    """The launcher's side of its fork servers (module docstring).

    One fork server started as a fresh interpreter serves every child; with zygotes
    (:mod:`sparseps.launch.zygote`, ``SPARSEPS_ZYGOTE_DIR``) there are two instead, both
    forked already imported, each on first use: one for the servers, one with torch for
    the workers. Once a fresh one was needed (no zygote up yet) it serves what is left.

    Args:
        env: the environment the children will have, role variables aside (any child's).
        fresh: whether a fork server may be started as a fresh interpreter; False: only
            zygotes' (a single child, which a fresh interpreter starts as cheaply: local
            mode's server); with none up, :meth:`spawn` and co. return None.
    """

    def __init__(self, env: Mapping[str, str], *, fresh: bool = True) -> None:
        self._env = _shared(env)
        self._zygotes = Zygotes.at(env, self._env)
        self._forked: dict[bool, _Channel] = {}  # by torch: fork servers from a zygote
        self._fresh: _Channel | None = None
        self._may_start_fresh = fresh
        self._missed: set[bool] = set()  # sides no zygote answered for
        self._closed = False
        self._channel(torch=False)  # now: a fresh one's imports overlap the launcher's work

    def _channels(self) -> list[_Channel]:
        return [*self._forked.values(), *([self._fresh] if self._fresh else [])]

    @property
    def pids(self) -> list[int]:
        """The fork server processes serving this launcher."""
        return [channel.pid for channel in self._channels()]

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
        """Whether a child with this environment can be forked (:meth:`spawn_module`): not
        after a fork server died (killed for its memory, say): children start fresh then."""
        return (
            not self._closed
            and not any(channel.closed for channel in self._channels())
            and _shared(env) == self._env
        )

    def _channel(self, *, torch: bool) -> _Channel | None:
        """The fork server for a child that imports torch or not; None once one died."""
        if self._closed or any(channel.closed for channel in self._channels()):
            return None
        if torch in self._forked:
            return self._forked[torch]
        if self._zygotes is not None and self._fresh is None and torch not in self._missed:
            got = self._zygotes.fork_server(torch=torch)
            if got is not None:
                self._forked[torch] = _Channel(*got, None)
                return self._forked[torch]
            self._missed.add(torch)  # asked once per launch: it counts the launches
        if self._fresh is None:
            if not self._may_start_fresh:
                return None
            self._fresh = _fresh_channel(self._env)
            if self._zygotes is not None and not torch:
                self._zygotes.expect(torch=True)  # the fresh one will serve the workers too
        return self._fresh

    def spawn_module(
        self, module: str, args: Sequence[str], env: Mapping[str, str], *, stdout: int, stderr: int
    ) -> ForkedProcess | None:
        """Fork a child running what ``python -m MODULE ARGS`` runs, with ``env`` (see
        :meth:`serves_env`) and its output into the file descriptors ``stdout`` and
        ``stderr`` (the caller's, still open after the call); never torch. None when the
        fork server cannot: start it as a fresh interpreter then."""
        channel = self._channel(torch=False)
        if channel is None:
            return None
        message = {
            "module": module, "argv": list(args), "env": dict(env), "cwd": os.getcwd(),
            "torch": False,
        }  # fmt: skip
        return channel.started(channel.request(message, [stdout, stderr]), None)

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], *, torch: bool
    ) -> ForkedProcess | None:
        """Fork a child running ``argv`` (a launched child's command line, see
        :meth:`serves`) with ``env``; ``torch``: it will import torch (a worker). None when
        the fork server cannot (dead, or holding torch for a child that would not import
        it): start the child as a fresh interpreter then."""
        channel = self._channel(torch=torch)
        if channel is None:
            return None
        read_end, write_end = os.pipe()
        try:
            reply = channel.request(
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
        proc = channel.started(reply, read_end)
        if proc is None:
            os.close(read_end)
        return proc

    def close(self) -> None:
        """Stop the fork servers (their children still running get SIGTERM from the
        kernel: call this once they are stopped)."""
        self._closed = True
        for channel in self._channels():
            channel.close()
