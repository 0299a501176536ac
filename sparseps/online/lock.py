"""One online job per model directory: an exclusive lock on ``MODEL_DIR/job.lock``.

Two jobs on one model directory would delete each other's in-progress saves
(:meth:`ModelDir.clean_incomplete`) and interleave passes in one ledger. So a job takes
``flock(LOCK_EX | LOCK_NB)`` on the lock file before it touches anything in the folder;
a second job fails at once with an error naming the folder and the holder. The kernel
drops the lock when the holder's process ends, however it ends (SIGKILL included), so a
crashed job never leaves a stale lock behind; the file itself stays and only says who
held it last.

Who takes it:

- ``sparseps online`` takes it in its own process (which also runs the launcher) before
  it creates the log folder or starts any process, and holds it until the job ended;
- worker 0's :class:`~sparseps.online.driver.OnlineDriver` takes it before it cleans or
  reads the folder; when the holder is a process it descends from (the ``sparseps
  online`` process that launched it, through the launcher's fork server), or names the
  job id worker 0 runs under (``SPARSEPS_JOB_ID``: with ``job.backend: ray`` worker 0
  runs under a Ray actor, on any node, not as the command's child), the lock is already
  held for this job and it goes on.

Worked example of the file (one JSON object, written after the lock is taken)::

    {"pid": 4242, "host": "trainer-7", "started": "2024-01-02T03:04:05", "cmd": "sparseps online",
     "job": "sps-ray-20240102-030405-a1b2c3"}

(``job`` only when the holder was given one.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from ..errors import ConfigError

__all__ = ["LOCK_NAME", "ModelDirBusyError", "ModelDirLock"]

LOCK_NAME = "job.lock"


class ModelDirBusyError(ConfigError):
    """Another online job holds the model directory's lock."""


class ModelDirLock:
    """The exclusive lock of one model directory; a context manager.

    Args:
        root: the model directory (created if missing: the lock file lives in it).
        what: a few words on the holder, recorded for the message another job prints.
        job_id: the job this holder takes the lock for, recorded so that the job's worker 0
            can accept it (:meth:`acquire`'s ``accept_job``); None: not recorded.
    """

    def __init__(
        self, root: str | Path, *, what: str = "sparseps online", job_id: str | None = None
    ) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self.what = what
        self.job_id = job_id
        self._fd: int | None = None
        self.inherited = False  # True: an ancestor of ours holds it for this job

    @property
    def held(self) -> bool:
        return self._fd is not None or self.inherited

    def acquire(
        self, *, accept_ancestor: bool = False, accept_job: str | None = None
    ) -> ModelDirLock:
        """Take the lock without waiting.

        Args:
            accept_ancestor: a lock held by a process this one descends from, on this
                host, counts as held for us (a launched worker of the ``sparseps online``
                process: its parent, or the launcher's fork server's parent).
            accept_job: a lock held for this job id (the holder recorded it) counts as
                held for us (worker 0 of a job whose ``sparseps online`` holds the lock
                from another process tree: Ray); None or empty: no job is accepted.

        Raises:
            ModelDirBusyError: another process holds it; names the folder and the holder.
        """
        if self.held:
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        # no O_TRUNC: the holder's record must survive a failed attempt
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.holder()
            ancestor = (
                accept_ancestor
                and holder.get("pid") in _ancestors()
                and holder.get("host") == socket.gethostname()
            )
            if ancestor or (accept_job and holder.get("job") == accept_job):
                self.inherited = True
                return self
            raise ModelDirBusyError(
                f"model directory {self.root} is in use by another online job "
                f"({_describe(holder)}); one job per model directory: wait for it to end "
                f"or use another save.model_dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "cmd": self.what,
        }
        if self.job_id:
            record["job"] = self.job_id
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        return self

    def holder(self) -> dict:
        """What the lock file says about its (last) holder; ``{}`` if unreadable."""
        try:
            record = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def release(self) -> None:
        """Drop the lock (the file stays: it names the last holder)."""
        self.inherited = False
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> ModelDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _describe(holder: dict) -> str:
    if not holder:
        return "holder unknown: it has not written its record yet"
    job = f", job {holder['job']}" if holder.get("job") else ""
    return (
        f"held by {holder.get('cmd', 'a job')}, pid {holder.get('pid', '?')} on host "
        f"{holder.get('host', '?')}, started {holder.get('started', '?')}{job}"
    )


def _ancestors() -> list[int]:
    """The pids this process descends from: its parent first (only the parent where
    ``/proc`` cannot be read)."""
    pids: list[int] = []
    pid = os.getppid()
    while pid > 1 and len(pids) < 64:
        pids.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
    return pids
