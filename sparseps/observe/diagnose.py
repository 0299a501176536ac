"""``sparseps diagnose LOG_DIR``: dump the Python stacks of every live role of a job and
say who waits on whom.

Reads ``LOG_DIR/pids.json`` (written by the launcher), sends ``SIGUSR1`` to each live
process that registered a stack dump (:mod:`sparseps.observe.stacks`), collects the new
dumps into ``LOG_DIR/diagnose-TIME/{role}.{rank}.txt`` and writes ``summary.txt`` there,
e.g.::

    worker 0 (pid 4242): in barrier (store_barrier, rendezvous.py:108) - waits on worker 1
    worker 1 (pid 4243): at job.py:61 in main (sleep)
    server 0 (pid 4240): serving requests (request loop)

A worker whose collective, barrier or server call times out runs it by itself
(:func:`diagnosed`, through :func:`auto_diagnose`) before the error is raised, and the
error names the folder.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, DeadlineError
from .stacks import DUMP_SIGNAL, HEADER, dump_own_stacks, process_start, stacks_dir

__all__ = [
    "DUMP_NOTE",
    "Diagnosis",
    "RoleStack",
    "add_arguments",
    "auto_diagnose",
    "diagnose",
    "diagnosed",
    "dump_note",
    "parse_dump",
    "run",
]

log = logging.getLogger(__name__)

# How a timeout's message names the folder of its automatic diagnosis.
DUMP_NOTE = "stacks of every role dumped to"
# How long a timing-out worker waits for the dumps (they take milliseconds; a process
# that cannot dump must not hold the error back long).
AUTO_TIMEOUT_S = 3.0
_NOTE = re.compile(rf"; {DUMP_NOTE} .*? \(summary\.txt there\)")

# Timeouts in several threads of one process at once (a pipeline thread's pull and the
# main thread's push on the same stopped server) share one diagnosis: a second run would
# signal every role again and read the same dumps. A timeout that arrives while another
# thread diagnoses waits for it and takes its note.
_auto_lock = threading.Lock()
_last_auto: tuple[float, str] = (float("-inf"), "")  # when the last one ended, its note

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_COLLECTIVES = {
    "all_reduce_sum": "all_reduce",
    "broadcast_array": "broadcast",
    "all_gather_arrays": "all_gather",
    "barrier": "gloo barrier",
}
_METRIC_COLLECTIVES = {  # sparseps/metrics/distributed.py (the pass metrics)
    "all_reduce_sum": "all_reduce",
    "all_reduce_array": "all_reduce",
    "all_gather_rows": "all_gather",
}


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


@dataclass
class RoleStack:
    """One role's dump: its threads (frames innermost first) and what its main thread does."""

    role: str
    rank: int
    pid: int
    threads: list[list[Frame]] = field(default_factory=list)
    state: str = "no dump"
    waits_in: str = ""  # "barrier", "gloo barrier", "rpc", ... (what it is blocked in)

    @property
    def name(self) -> str:
        return f"{self.role} {self.rank}"


@dataclass(frozen=True)
class Diagnosis:
    """Where the dumps went and the summary lines (also in ``folder/summary.txt``)."""

    folder: Path
    lines: tuple[str, ...]
    roles: tuple[RoleStack, ...]


def parse_dump(text: str) -> list[list[Frame]]:
    """faulthandler's output: one list of frames (innermost first) per thread."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif threads and (m := _FRAME.match(line)):
            threads[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
    return threads


def _main_thread(threads: list[list[Frame]]) -> list[Frame]:
    for frames in threads:
        if frames and frames[-1].func in ("_run_module_as_main", "<module>"):
            return frames
    return threads[0] if threads else []


def _inside(frame: Frame, part: str) -> bool:
    return part in frame.file.replace(os.sep, "/")


def _skipped(frame: Frame) -> bool:
    """Frames of the diagnosis itself (in the process that runs it)."""
    return _inside(frame, "sparseps/observe/") or "faulthandler" in frame.file


def _classify(frames: list[Frame]) -> tuple[str, str]:
    """``(state, waits_in)`` of a main thread (frames innermost first)."""
    frames = [f for f in frames if not _skipped(f)]
    if not frames:
        return "no Python frame", ""
    for i, f in enumerate(frames):
        if _inside(f, "sparseps/runtime/rendezvous.py") and f.func == "store_barrier":
            return f"in barrier ({f.func}, {f.short()}{_caller(frames, i)})", "barrier"
        if _inside(f, "sparseps/core/collectives.py") and f.func in _COLLECTIVES:
            what = _COLLECTIVES[f.func]
            return f"in {what} ({f.func}, {f.short()}{_caller(frames, i)})", what
        if _inside(f, "sparseps/metrics/distributed.py") and f.func in _METRIC_COLLECTIVES:
            what = _METRIC_COLLECTIVES[f.func]
            return f"in metrics {what} ({f.func}, {f.short()}{_caller(frames, i)})", what
        if _inside(f, "sparseps/rpc/"):
            j = i
            while j + 1 < len(frames) and _inside(frames[j + 1], "sparseps/rpc/"):
                j += 1
            outer = frames[j]
            return (
                f"waiting on servers in {outer.func} ({outer.short()}{_caller(frames, j)})",
                "rpc",
            )
        if _inside(f, "sparseps/server/loop.py") and f.func == "run":
            return "serving requests (request loop)", ""
        if _inside(f, "sparseps/worker/pipeline.py"):
            return f"in the data pipeline ({f.func}, {f.short()}{_caller(frames, i)})", "data"
    top = frames[0]
    user = next(
        (f for f in frames if "site-packages" not in f.file and "/lib/python" not in f.file), top
    )
    extra = f" ({top.func})" if user is not top else ""
    return f"at {user.short()} in {user.func}{extra}", ""


def _caller(frames: list[Frame], i: int) -> str:
    """ ", called from FILE:LINE" of the first frame outside sparseps below frame ``i``."""
    for f in frames[i + 1 :]:
        if "/sparseps/" not in f.file.replace(os.sep, "/") and "/lib/python" not in f.file:
            return f", from {f.short()} {f.func}"
    return ""


def _live_children(log_dir: Path) -> list[dict]:
    path = log_dir / "pids.json"
    if not path.is_file():
        raise ConfigError(f"diagnose: {path} not found; give the log dir of a launched job")
    record = json.loads(path.read_text())
    latest: dict[tuple[str, int], dict] = {}
    for child in record.get("children", []):
        latest[(child["role"], int(child["rank"]))] = child  # the newest attempt wins
    return [c for c in latest.values() if _alive(int(c["pid"]))]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _stacks_file(log_dir: Path, child: dict) -> Path | None:
    """The child's stacks file, if it registered one and the pid is still that process."""
    path = stacks_dir(log_dir) / f"{child['role']}.{child['rank']}.{child['pid']}.txt"
    try:
        with open(path, encoding="utf-8") as f:
            header = f.readline()
    except OSError:
        return None
    start = process_start(int(child["pid"]))
    if not header.startswith(HEADER) or not start or f"start={start}" not in header:
        return None
    return path


def diagnose(log_dir: str | Path, *, timeout_s: float = 5.0, reason: str = "") -> Diagnosis:
    """Dump every live role's stacks into ``LOG_DIR/diagnose-TIME/`` and summarise them.

    Args:
        log_dir: the job's log dir (holding ``pids.json``).
        timeout_s: how long to wait for the dumps.
        reason: written at the top of the summary (e.g. the timeout that triggered it).

    Raises:
        ConfigError: ``log_dir`` holds no ``pids.json``.
    """
    log_dir = Path(log_dir)
    children = _live_children(log_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = log_dir / f"diagnose-{stamp}-{os.getpid()}"
    for n in range(2, 1000):  # two diagnoses of one process within a second
        try:
            folder.mkdir(parents=True)
            break
        except FileExistsError:
            folder = log_dir / f"diagnose-{stamp}-{os.getpid()}-{n}"
    targets: list[tuple[dict, Path, int]] = []
    roles: list[RoleStack] = []
    for child in sorted(children, key=lambda c: (c["role"], int(c["rank"]))):
        role = RoleStack(child["role"], int(child["rank"]), int(child["pid"]))
        roles.append(role)
        path = _stacks_file(log_dir, child)
        if path is None:
            role.state = "no stack handler (not started by this launcher, or too early)"
            continue
        if _stopped(role.pid):  # it would dump only once resumed: no wait for it
            role.state = "stopped (SIGSTOP or a debugger): no dump"
            continue
        size = path.stat().st_size
        try:
            if role.pid != os.getpid() or not dump_own_stacks():
                os.kill(role.pid, DUMP_SIGNAL)
        except ProcessLookupError:
            role.state = "exited"
            continue
        targets.append((child, path, size))
    texts = _collect(targets, timeout_s)
    for role in roles:
        text = texts.get((role.role, role.rank))
        if text is None:
            if any(int(t[0]["pid"]) == role.pid for t in targets):
                role.state = f"no dump within {timeout_s:g} s"
            continue
        (folder / f"{role.role}.{role.rank}.txt").write_text(text)
        role.threads = parse_dump(text)
        role.state, role.waits_in = _classify(_main_thread(role.threads))
        if role.pid == os.getpid() and reason:
            role.state += f" (timed out here: {reason.split(';')[0][:160]})"
    lines = _summary(roles)
    head = [f"# {reason}"] if reason else []
    (folder / "summary.txt").write_text("\n".join([*head, *lines]) + "\n")
    return Diagnosis(folder, tuple(lines), tuple(roles))


def _collect(targets: list[tuple[dict, Path, int]], timeout_s: float) -> dict:
    """The new text of each stacks file once it stopped growing (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    sizes = {id(t): t[2] for t in targets}
    stable: dict[int, float] = {}
    while time.monotonic() < deadline:
        now = time.monotonic()
        for t in targets:
            size = t[1].stat().st_size
            if size != sizes[id(t)]:
                sizes[id(t)], stable[id(t)] = size, now
        if len(stable) == len(targets) and all(now - s > 0.2 for s in stable.values()):
            break
        time.sleep(0.05)
    out = {}
    for child, path, start in targets:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(start)
            text = f.read()
        if text.strip():
            out[(child["role"], int(child["rank"]))] = text
    return out


def _summary(roles: list[RoleStack]) -> list[str]:
    lines = []
    workers = [r for r in roles if r.role == "worker"]
    for role in roles:
        line = f"{role.name} (pid {role.pid}): {role.state}"
        if role.waits_in in ("barrier", "gloo barrier", "all_reduce", "all_gather", "broadcast"):
            others = [w.name for w in workers if w is not role and w.waits_in != role.waits_in]
            if others:
                line += f" - waits on {', '.join(others)}"
        lines.append(line)
    if not roles:
        lines.append("no live process of the job (every role has exited)")
    return lines


def auto_diagnose(what: str, log_dir: str | None = None) -> str:
    """Run :func:`diagnose` for a timeout of this worker; returns a note for its error.

    Never raises: a failing diagnosis must not hide the timeout. Without a launched job
    (no ``pids.json`` in the log dir, e.g. local mode) it does nothing and returns "".
    """
    try:
        if log_dir is None:
            from ..env import from_environ

            role = from_environ()
            log_dir = role.log_dir if role is not None and not role.local else None
        if not log_dir or not (Path(log_dir) / "pids.json").is_file():
            return ""
        return _auto(what, log_dir)
    except Exception as exc:  # the timeout error matters more than its diagnosis
        log.warning("%s: automatic diagnosis failed: %s", what, exc)
        return ""


def _auto(what: str, log_dir: str) -> str:
    global _last_auto
    asked = time.monotonic()
    with _auto_lock:
        ended, note = _last_auto
        if ended >= asked and note:  # another thread diagnosed while this one waited
            return note
        result = diagnose(log_dir, timeout_s=AUTO_TIMEOUT_S, reason=what)
        log.error(
            "%s: stacks of every role dumped to %s:\n  %s",
            what, result.folder, "\n  ".join(result.lines),
        )  # fmt: skip
        note = f"; {DUMP_NOTE} {result.folder} (summary.txt there)"
        _last_auto = (time.monotonic(), note)
        return note


def diagnosed(exc: DeadlineError) -> DeadlineError:
    """``exc`` with the folder of an automatic diagnosis appended (run now).

    The one hook of every timeout that should dump the job's stacks (worker collectives,
    the metrics' all-reduce, a server call's :meth:`~sparseps.rpc.handle.Handle.wait`):
    returns ``exc`` itself outside a launched job, when the diagnosis fails, or when
    ``exc`` already names a dump (so a caller up the stack that hooks too adds nothing).
    """
    if DUMP_NOTE in exc.message:
        return exc
    note = auto_diagnose(exc.message)
    if not note:
        return exc
    return DeadlineError(
        exc.message + note, op=exc.op, role=exc.role, rank=exc.rank, address=exc.address,
        seconds=exc.seconds, setting=exc.setting,
    )  # fmt: skip


def dump_note(message: str) -> str:
    """The ``; stacks of every role dumped to … (summary.txt there)`` part of ``message``,
    or "": for a caller that replaces a diagnosed error with its own message."""
    found = _NOTE.search(message)
    return found[0] if found else ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log_dir", help="the job's log dir (holding pids.json)")
    parser.add_argument(
        "--timeout-s", type=float, default=5.0, help="how long to wait for the dumps (default 5)"
    )


def run(args: argparse.Namespace) -> int:
    result = diagnose(args.log_dir, timeout_s=args.timeout_s)
    print(f"stacks in {result.folder}")
    for line in result.lines:
        print(line)
    return 0
