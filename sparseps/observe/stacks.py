"""Python stack dumps on a signal: every role registers :mod:`faulthandler` on ``SIGUSR1``.

faulthandler writes from its C signal handler, so a process whose main thread is blocked
in a C call (a gloo wait, a zmq poll, a lock) still dumps every thread's stack; py-spy
would need ptrace, which containers often forbid.

Each role appends its dumps to ``LOG_DIR/stacks/{role}.{rank}.{pid}.txt``; the first line
records the process's start time, so that a tool never signals a recycled pid (the
default action of ``SIGUSR1`` would kill a process that registered no handler).
"""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import TextIO

__all__ = [
    "DUMP_SIGNAL", "HEADER", "dump_own_stacks", "enable_stack_dumps", "process_start", "stacks_dir",
]  # fmt: skip

DUMP_SIGNAL = signal.SIGUSR1
HEADER = "# sparseps stack dumps"
_file: TextIO | None = None  # kept open for faulthandler's lifetime


def stacks_dir(log_dir: str | Path) -> Path:
    return Path(log_dir) / "stacks"


def process_start(pid: int) -> str:
    """The start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22);
    "" when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def enable_stack_dumps(log_dir: str | Path, role: str, rank: int) -> Path:
    """Dump every thread's stack to this role's stacks file on ``SIGUSR1``; idempotent.

    Returns:
        the stacks file.
    """
    global _file
    folder = stacks_dir(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{role}.{rank}.{os.getpid()}.txt"
    if _file is not None:
        return path
    _file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life
    _file.write(
        f"{HEADER} role={role} rank={rank} pid={os.getpid()} start={process_start(os.getpid())}\n"
    )
    _file.flush()
    faulthandler.register(DUMP_SIGNAL, file=_file, all_threads=True, chain=False)
    return path


def dump_own_stacks() -> bool:
    """Append this process's stacks to its stacks file, from Python (False: dumps are not
    enabled here). A process diagnosing itself calls this instead of signalling itself:
    faulthandler's signal handler runs at any instant on any thread and reads the other
    threads' frames without the GIL, which crashed a worker (SIGSEGV) whose data pipeline
    was busy; called from Python it holds the GIL, and no thread's frames move meanwhile.
    """
    if _file is None:
        return False
    faulthandler.dump_traceback(file=_file, all_threads=True)
    _file.flush()
    return True
