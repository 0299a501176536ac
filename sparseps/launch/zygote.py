"""Zygotes: fork servers kept warm between launches, for a user who launches many jobs.

A launcher's fork server (:mod:`sparseps.launch.fork_server`) spends ~5 CPU-seconds on
its imports (torch, numba and the kernels numba's cache holds) before its first fork,
once per job. Where jobs follow each other — a test suite, a parameter sweep — that is
paid again by every launch. With ``SPARSEPS_ZYGOTE_DIR`` naming a folder private to the
user (mode 700), the launcher instead asks a *zygote* there, a process that has done those
imports once, to fork it a fork server:

- a zygote serves one environment (the children's, role variables aside, as a fork
  server does), one interpreter, one state of the installed code (sparseps' source files
  and the ``site-packages`` folders) and one side: ``server`` (the server set) or ``torch`` (that
  and torch, for the workers). Its socket in the folder is named by a hash of them, so a
  launcher with anything different never reaches it;
- the launcher passes its end of a socket pair (``SCM_RIGHTS``); the zygote forks, and
  the child is that launcher's fork server from then on, as one it had started itself:
  it exits when the launcher's end closes (the launcher's exit, even by SIGKILL), and its
  children get SIGTERM when it does;
- a launcher that finds no zygote for its environment uses a fork server of its own, and
  starts the zygote in the background if it is not the first to ask (an environment seen
  once costs none; a lock file keeps two launchers from starting the same; at most
  ``_MAX_ZYGOTES`` per folder): the next launch finds it;
- a zygote exits after ``IDLE_S`` without a request, or when its socket is gone from the
  folder (removing the folder stops them all). It accepts only processes of its own user
  (``SO_PEERCRED``), and a launcher only a zygote of its own user.

The test suite runs its jobs this way (tests/conftest.py): the same few environments
launch ~100 jobs per test process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import select
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ..env import ZYGOTE_DIR
from . import fork_process
from .fork_process import MAX_MESSAGE

__all__ = ["IDLE_S", "Zygotes"]

log = logging.getLogger(__name__)

IDLE_S = 600.0  # a zygote exits after this long without a request
_POLL_S = 2.0  # how often an idle zygote looks for its socket (its folder removed: exit)
_START_LOCK_S = 120.0  # a start lock older than this was left by a zygote that died
_MAX_ZYGOTES = 8  # per folder: each holds 200-400 MB
_CONNECT_TIMEOUT_S = 30.0
# it forks before any import and the first process exits at once: the launcher that
# starts it waits only for that, and the zygote is nobody's child
_ENTRY = (
    "import os\nif os.fork():\n    os._exit(0)\nfrom sparseps.launch.zygote import main\nmain()"
)
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _peer_uid(sock: socket.socket) -> int:
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    return _CREDENTIALS.unpack(credentials)[1]


def _private_folder(value: str) -> Path | None:
    """The folder ``SPARSEPS_ZYGOTE_DIR`` names, if it is one of this user's that no one
    else can enter; None (with a warning) otherwise."""
    path = Path(value)
    try:
        info = path.stat()
    except OSError as exc:
        log.warning("%s=%s: %s; no zygotes", ZYGOTE_DIR, value, exc.strerror)
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        log.warning(
            "%s=%s is not a folder of this user's closed to others (chmod 700 it); no zygotes",
            ZYGOTE_DIR,
            value,
        )
        return None
    return path


def _installed_state() -> list:
    """What a zygote's imports depend on besides the environment: sparseps' source files
    and the package folders (installing or removing a package changes its folder's time)."""
    package = Path(__file__).resolve().parents[1]
    state: list = []
    for path in sorted(package.rglob("*.py")):
        with contextlib.suppress(OSError):
            info = path.stat()
            state.append([str(path), info.st_mtime_ns, info.st_size])
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            with contextlib.suppress(OSError):
                state.append([entry, os.stat(entry).st_mtime_ns])
    return state


class Zygotes:
    """A launcher's way to its user's zygotes for one environment (module docstring)."""

    def __init__(self, folder: Path, env: Mapping[str, str]) -> None:
        self.folder = folder
        self._env = dict(env)
        state = json.dumps([sys.executable, sorted(self._env.items()), _installed_state()])
        self._hash = hashlib.sha256(state.encode()).hexdigest()[:20]

    @classmethod
    def at(cls, environ: Mapping[str, str], env: Mapping[str, str]) -> Zygotes | None:
        """The zygotes of ``environ``'s ``SPARSEPS_ZYGOTE_DIR`` for children with the
        shared environment ``env``; None when it is unset or not a private folder."""
        value = environ.get(ZYGOTE_DIR, "").strip()
        folder = _private_folder(value) if value else None
        return None if folder is None else cls(folder, env)

    def _key(self, torch: bool) -> str:
        return f"{self._hash}-{'torch' if torch else 'server'}"

    def fork_server(self, *, torch: bool) -> tuple[socket.socket, int] | None:
        """(the socket to a fork server a zygote forked for this launcher, its pid); None
        when no zygote answered (one is started for the next launch)."""
        key = self._key(torch)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.settimeout(_CONNECT_TIMEOUT_S)
                conn.connect(str(self.folder / f"{key}.sock"))
                if _peer_uid(conn) != os.getuid():
                    raise PermissionError("a zygote of another user")
                socket.send_fds(conn, [b"fork"], [theirs.fileno()])
                pid = int(json.loads(conn.recv(4096))["pid"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ours.close()
            if not isinstance(exc, FileNotFoundError | ConnectionRefusedError):
                log.warning("zygote %s: %s; starting a fork server of our own", key, exc)
            self._start(key, torch)
            return None
        finally:
            theirs.close()
        return ours, pid

    def expect(self, *, torch: bool) -> None:
        """A launch of this environment went without a zygote for ``torch``'s side: start
        it for the next, as :meth:`fork_server` does when it finds none."""
        key = self._key(torch)
        if not (self.folder / f"{key}.sock").exists():
            self._start(key, torch)

    def _start(self, key: str, torch: bool) -> None:
        """Start the zygote ``key`` in the background, from the second launch with this
        environment on (a one-off environment never costs a zygote), unless one is starting
        already or the folder has ``_MAX_ZYGOTES``."""
        seen = self.folder / f"{key}.seen"
        if not seen.exists():
            seen.touch()
            return
        if len(list(self.folder.glob("*.sock"))) >= _MAX_ZYGOTES:
            return
        lock = self.folder / f"{key}.starting"
        try:
            if time.time() - lock.stat().st_mtime > _START_LOCK_S:
                lock.unlink(missing_ok=True)  # its zygote died before it was ready
        except FileNotFoundError:
            pass
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
        with open(self.folder / f"{key}.log", "ab") as out:
            subprocess.run(
                [sys.executable, "-u", "-c", _ENTRY, str(self.folder), key, str(int(torch))],
                env=self._env, cwd="/", stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True, check=False, timeout=60,
            )  # fmt: skip


# -- the zygote process ----------------------------------------------------------------


def _listen(folder: Path, key: str) -> tuple[socket.socket, Path, int]:
    """Listen on ``folder/key.sock``, created under another name and renamed: a launcher
    never connects to a zygote that is not ready."""
    path = folder / f"{key}.sock"
    staging = folder / f"{key}.{os.getpid()}.bind"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(staging))
    listener.listen(16)
    os.rename(staging, path)
    return listener, path, path.stat().st_ino


def _serve_launchers(listener: socket.socket, path: Path, inode: int) -> socket.socket | None:
    """Fork a fork server for each launcher that asks; returns its socket in a forked
    child, None in the zygote when it is time to exit (module docstring)."""
    last = time.monotonic()
    while True:
        ready, _, _ = select.select([listener], [], [], _POLL_S)
        for _ in fork_process.reaped():  # its fork servers that exited
            pass
        try:
            if os.stat(path).st_ino != inode:
                return None  # another zygote's now, or the folder is gone
        except OSError:
            return None
        if not ready:
            if time.monotonic() - last > IDLE_S:
                with contextlib.suppress(OSError):
                    path.unlink()
                return None
            continue
        conn, _ = listener.accept()
        last = time.monotonic()
        with conn:
            try:
                conn.settimeout(10.0)
                if _peer_uid(conn) != os.getuid():
                    continue
                _, fds, _, _ = socket.recv_fds(conn, 64, 1)
            except OSError:
                continue
            if len(fds) != 1:
                continue
            fork_process.before_fork()
            try:
                pid = os.fork()
            except OSError as exc:
                os.close(fds[0])
                log.warning("zygote: fork failed: %s", exc)
                continue
            if pid == 0:
                listener.close()
                return socket.socket(fileno=fds[0])
            os.close(fds[0])
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"pid": pid}).encode())


def main() -> None:
    """A zygote (``python -c _ENTRY FOLDER KEY TORCH``, started by :class:`Zygotes`)."""
    folder, key, torch = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    from ..core.jit import load_cached_kernels

    try:
        fork_process.import_all(fork_process.SERVER_SET)
        if torch:
            fork_process.import_all(fork_process.WORKER_SET)
            with contextlib.suppress(Exception):  # a warm-up: a failure costs only time
                fork_process.warm_export()
        load_cached_kernels()
        listener, path, inode = _listen(folder, key)
    finally:
        (folder / f"{key}.starting").unlink(missing_ok=True)
    sock = _serve_launchers(listener, path, inode)
    if sock is not None:  # a launcher's fork server from now on
        fork_process.serve(sock, has_torch=torch)
