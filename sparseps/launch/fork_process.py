"""The fork server process (:mod:`sparseps.launch.fork_server` has the launcher's side and
the whole story): it imports the libraries every role imports, then forks each child the
launcher asks for, and the child becomes what ``python -u -m sparseps.observe.child ARGS``
(or ``python -m MODULE ARGS``) would have been. A zygote (:mod:`sparseps.launch.zygote`)
forks fork servers already imported and hands each to :func:`serve`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
from collections.abc import Iterator, Sequence

from ..env import process_environ
from .procutil import die_with_parent

__all__ = [
    "MAX_MESSAGE",
    "SERVER_SET",
    "WORKER_SET",
    "import_all",
    "warm_export",
    "before_fork",
    "main",
    "reaped",
    "serve",
]

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
MAX_MESSAGE = 1 << 20  # a request's size limit (its environment): the socket's buffer


def warm_export() -> None:
    """Run ``torch.export`` once on a tiny module, so that its lazy imports and caches
    (~1.5 CPU-s) are paid here and not by a forked worker's first inference save (0.24
    against 1.4 CPU-s, measured). The zygotes' torch side does it once for every job
    (:mod:`sparseps.launch.zygote`); a launcher's own fork server does not (a job that
    never saves an inference model would wait for it)."""
    import torch

    batch = torch.export.Dim("batch", min=1)
    linear = torch.nn.Linear(3, 2).eval()
    torch.export.export(linear, (torch.zeros(2, 3),), dynamic_shapes=({0: batch},))


def import_all(names: Sequence[str]) -> None:
    for name in names:
        with contextlib.suppress(ImportError):  # an optional extra: the child will say
            importlib.import_module(name)


def _serve(sock: socket.socket, has_torch: bool) -> tuple[dict, list[int]] | None:
    """Fork children until the launcher closes the socket; returns (the request, its
    output fds: one for stdout and stderr, or one each) in a forked child, None in the
    fork server when done. ``has_torch``: torch is imported already (no server then)."""

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)

    def send(message: dict) -> None:
        with contextlib.suppress(OSError):
            sock.send(json.dumps(message).encode())

    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            for pid, code in reaped():
                send({"exited": pid, "code": code})
        if sock.fileno() not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
        except OSError:
            data, fds = b"", []
        if not data:
            return None
        request = json.loads(data)
        if not fds:
            send({"id": request["id"], "error": "no output pipe came with the request"})
            continue
        if request["torch"] and not has_torch:
            import_all(WORKER_SET)
            has_torch = True
        elif not request["torch"] and has_torch:
            _close_all(fds)
            send({"id": request["id"]})  # a fresh interpreter keeps a server torch-free
            continue
        before_fork()
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


def before_fork() -> None:
    """What a fork server (or a zygote) does before each fork: load the kernels other
    processes have compiled since (once, here, not in every child), and move everything it
    holds to the collector's permanent generation: a child's collections (and its exit's)
    never walk the inherited objects, nor write to their pages (a server's exit took ~0.5
    CPU-s without it, 0.1 with it)."""
    from ..core.jit import load_cached_kernels  # numba: the fork server's imports have it

    load_cached_kernels()
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()


def reaped() -> Iterator[tuple[int, int]]:
    """(pid, exit code as :class:`subprocess.Popen` gives it) of each child that has
    exited, reaped now."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


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
    environ = process_environ()  # the child's whole environment is the request's
    environ.clear()
    environ.update(request["env"])
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


def serve(sock: socket.socket, *, has_torch: bool) -> None:
    """Be a fork server on ``sock`` (its imports done) until the launcher closes it; in a
    forked child, become the child and run it."""
    server_pid = os.getpid()
    job = _serve(sock, has_torch)
    if job is not None:
        _become(*job, server_pid)


def main() -> None:
    """The fork server process (``python -c _ENTRY FD``: FD is its end of the socket)."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    import_all(SERVER_SET)
    serve(sock, has_torch=False)
