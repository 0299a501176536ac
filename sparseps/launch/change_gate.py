"""Scale requests against a job's completion: one in flight holds it, one after is refused.

A job completes once every worker it waits for exited 0. A scale request
(:mod:`sparseps.launch.scaling`) may add a worker to wait for, so the job must not
complete while one is in flight; and once the job is *finishing* (it decided to
complete: its servers are being stopped) a new request would start processes nobody
waits for, so it is refused with :data:`~sparseps.launch.records.FINISHING_NOTE`. The
local launcher's :class:`~sparseps.launch.worker_world.WorkerWorld` and the Ray
driver's :class:`~sparseps.launch.ray_job.RayJob` follow this one rule.
"""

from __future__ import annotations

import threading

from .records import FINISHING_NOTE

__all__ = ["ChangeGate"]


class ChangeGate:
    """The scale requests in flight and whether the job is finishing.

    Args:
        lock: the owner's lock (reentrant): a request's thread and the job's loop share it,
            so that what the owner counts to decide completion and the gate agree.
    """

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._changes = 0
        self.finishing = False

    @property
    def in_flight(self) -> int:
        """The requests admitted and not yet done."""
        return self._changes

    def begin(self) -> str:
        """A scale request starts: "" when it may go on (the job does not finish until
        :meth:`end`), else why not (the job is finishing)."""
        with self._lock:
            if self.finishing:
                return FINISHING_NOTE
            self._changes += 1
            return ""

    def end(self) -> None:
        """The request that :meth:`begin` admitted is done."""
        with self._lock:
            self._changes -= 1

    def finish(self, *, done: bool) -> bool:
        """Whether the job finishes now: its workers are ``done`` and no request is in
        flight; from then on every request is refused. Call under the owner's lock with
        ``done`` read under it."""
        with self._lock:
            self.finishing = done and not self._changes
            return self.finishing

    def reopen(self) -> None:
        """A new generation of workers starts (a group restart): requests are admitted
        again."""
        with self._lock:
            self.finishing = False
