"""Small process helpers shared by the launcher and the local-mode server.

Every child runs in its own session (so its process group holds it and anything it
spawns) and, on Linux, asks the kernel to SIGTERM it when its parent dies: even a
launcher killed with SIGKILL leaves no orphan behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

__all__ = ["die_with_parent", "die_with_parent_hook", "signal_groups", "stop_groups", "tail"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when this process dies (Linux).

    libc is loaded here, before ``fork``, so the hook itself only makes one system call
    in the child. Returns None where ``prctl`` is not available.

    Note: the kernel ties the signal to the *thread* that forked, so spawn from a
    long-lived thread (the launcher and ``sps.init`` spawn from the main thread).
    """
    libc = _libc()
    if libc is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        _die_with(libc, parent)

    return hook


def die_with_parent(parent: int) -> None:
    """In a child just forked by ``parent`` (the fork server): get SIGTERM when it dies,
    or exit now if it already has."""
    libc = _libc()
    if libc is not None:
        _die_with(libc, parent)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name, use_errno=True)


def _die_with(libc: ctypes.CDLL, parent: int) -> None:
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def signal_groups(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to the process group led by each pid (children are session leaders)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # group already gone
            os.killpg(pid, sig)


class Process(Protocol):
    """What stopping needs of a child: a :class:`subprocess.Popen` or a forked one
    (:class:`sparseps.launch.fork_server.ForkedProcess`)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def stop_groups(procs: Iterable[Process], grace_s: float) -> None:
    """SIGTERM each process group, wait up to ``grace_s``, then SIGKILL what is left.

    The SIGKILL goes to every group, also to those whose leader exited on time: a
    leader's children (a data ``pipe_command``, say) must not outlive the job.
    """
    procs = list(procs)
    signal_groups([p.pid for p in procs if p.poll() is None], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning(
                "pid %d did not stop within %.1f s of SIGTERM; sending SIGKILL", p.pid, grace_s
            )
    signal_groups([p.pid for p in procs], signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
            log.error("pid %d survived SIGKILL", p.pid)


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a text file (reads at most its last 256 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]
