"""The workers a one-node launch counts: its worker *world*, apart from its processes.

:class:`~sparseps.launch.supervisor.Supervisor` starts, watches and stops processes; this
module keeps the other half of what it needs to know about the workers once the job is
elastic (``sparseps scale --workers``, a dead worker's leave: docs/elastic.md):

- the *members*: the launch ranks of the job's current workers (the launch's workers
  until a scale or a leave changed them);
- the workers the job still *waits for* (the job completes when this set is empty);
- the specs of workers that died and left (a group restart may reuse their log and
  metrics port for the rank that takes their place);
- the scale requests in flight and whether the job is *finishing* (every worker exited
  0): a request in flight delays completion, one after it is refused;
- the specs a worker group restart starts: the current members as ranks ``0..n-1`` of a
  world of ``n`` (the new generation's rendezvous counts ``0..n-1``).

Why a separate object: these rules change with the elastic protocol, the supervision
rules (fail fast, restart the group, stop in order) do not; each reads on its own. The
supervisor owns one :class:`WorkerWorld` and hands it the three things it shares: the
job's child specs (one list, edited in place by both), the lock that orders a scale
request's thread against the supervision loop, and the coordinator (a one-node
launch's :class:`~sparseps.launch.node_sync.LocalCoordinator` counts the workers).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from ..env import RANK, WORKER_NUM, Role
from .change_gate import ChangeGate
from .node_sync import Coordinator, LocalCoordinator
from .records import ChildSpec

__all__ = ["WorkerWorld"]

log = logging.getLogger(__name__)


class WorkerWorld:
    """The membership of a launch's workers (module docstring).

    Args:
        children: the supervisor's child specs (servers and workers); the worker entries
            are edited in place as workers join, leave and restart.
        lock: the supervisor's lock (reentrant): a scale request's thread and the
            supervision loop both change the world.
        coordinator: told the worker count when it is a one-node launch's.
    """

    def __init__(
        self, children: list[ChildSpec], lock: threading.RLock, coordinator: Coordinator
    ) -> None:
        self._children = children
        self._lock = lock
        self._coordinator = coordinator
        # the launch ranks of the workers the job still waits for (set by begin_generation)
        self.waiting: set[int] = set()
        # the launch ranks of the current workers once a scale or a leave changed them
        # (None: the launch's workers); a group restart starts these only
        self._members: list[int] | None = None
        self._departed: dict[int, ChildSpec] = {}  # specs of workers that died and left
        # scale requests in flight (begin_change) and whether the job is finishing: every
        # worker exited 0, so a change would start processes nobody waits for
        self._gate = ChangeGate(lock)

    def _worker_ranks(self) -> set[int]:
        return {c.rank for c in self._children if c.role is Role.WORKER}

    @property
    def members(self) -> list[int]:
        """The launch ranks of the job's current workers (sorted): the launch's workers
        until a scale or a leave changed them."""
        if self._members is not None:
            return list(self._members)
        return sorted(self._worker_ranks())

    # -- a generation's completion -------------------------------------------------------

    def begin_generation(self) -> None:
        """A generation of workers starts (the launch's, or a group restart's): the job
        waits for every worker spec, and is no longer finishing."""
        self.waiting = self._worker_ranks()
        self._gate.reopen()

    def finished(self, rank: int) -> None:
        """Worker ``rank`` exited 0: the job no longer waits for it."""
        self.waiting.discard(rank)

    def finish(self) -> int | None:
        """Once no worker is waited for: the job is finishing unless a scale request is
        in flight (it may add workers to wait for; once finishing, new ones are refused:
        :meth:`begin_change`). Returns the job's worker count to report done, or None
        while it is not finishing."""
        with self._lock:  # a scale request may be adding a worker
            if not self._gate.finish(done=not self.waiting):
                return None
            return len(self._worker_ranks())

    # -- changes while the job runs (sparseps scale: sparseps.launch.scaling) -------------

    def begin_change(self) -> str:
        """A scale request starts: "" when it may go on (the job does not complete until
        :meth:`end_change`), else why not: the job is finishing (every worker exited 0)
        or finished."""
        return self._gate.begin()

    def end_change(self) -> None:
        """The scale request that :meth:`begin_change` admitted is done."""
        self._gate.end()

    def join(self, spec: ChildSpec) -> None:
        """Worker ``spec`` is about to start while the job runs: the job waits for it and
        a group restart restarts it (a rank that joins again replaces its old spec)."""
        with self._lock:
            self._children[:] = [
                c for c in self._children if not (c.role is Role.WORKER and c.rank == spec.rank)
            ]
            self._children.append(spec)
            self.waiting.add(spec.rank)
            self._members = sorted({*self.members, spec.rank})

    def set_world(self, count: int) -> None:
        """The job's worker count is now ``count``: the lowest ``count`` members stay
        (workers of higher ranks exit 0 by themselves; the job completes when every worker
        ever started exited 0)."""
        with self._lock:
            self._members = self.members[:count]
            self._count_workers()

    def leave(
        self,
        spec: ChildSpec,
        pid: int,
        code: int,
        worker_left: Callable[[int, int], str | None] | None,
    ) -> bool:
        """Whether worker ``spec``, which exited with non-zero ``code``, left the job:
        ``worker_left`` (the supervisor's hook) recorded its death as a leave. Its spec is
        then dropped (a group restart would not start it again) and the job completes
        without it; otherwise it fails or restarts the job as usual."""
        if worker_left is None:
            return False
        rank = spec.rank
        try:
            why = worker_left(rank, code)
        except Exception as exc:  # never kill the launcher; the job fails as before
            why = f"recording its leave failed: {type(exc).__name__}: {exc}"
        if why is None:
            return False
        if why:
            log.error("%s (pid %d) exited with code %d and the job cannot go on without it: "
                      "%s", spec.name, pid, code, why)  # fmt: skip
            return False
        with self._lock:
            self._members = [r for r in self.members if r != rank]
            self._departed[rank] = spec
            self._children[:] = [
                c for c in self._children if not (c.role is Role.WORKER and c.rank == rank)
            ]
            self.waiting.discard(rank)
            self._count_workers()
        log.warning("%s (pid %d) exited with code %d: it LEFT the job (recorded in the "
                    "workers' membership); the other workers finish its pass and go on "
                    "without it", spec.name, pid, code)  # fmt: skip
        return True

    def _count_workers(self) -> None:
        # a one-node launch's coordinator completes the job once this many workers are
        # done, so it follows every join, leave and shrink
        if isinstance(self._coordinator, LocalCoordinator):
            self._coordinator.worker_num = len(self._worker_ranks())

    # -- a worker group restart ----------------------------------------------------------

    def restart_specs(self) -> list[ChildSpec]:
        """The workers of a restarted generation: the launch's workers unchanged, or,
        once a scale or a leave changed them, the current members as ranks ``0..n-1``
        with ``SPARSEPS_WORKER_NUM`` = n (each rank's own spec: log, metrics port; the
        ones of workers shrunk away or dead are dropped, so the job waits for the new
        generation only)."""
        with self._lock:
            workers = [c for c in self._children if c.role is Role.WORKER]
            if self._members is None:
                return workers
            n = len(self._members)
            known = {**self._departed, **{c.rank: c for c in workers}}
            if not known:
                return workers
            first = known.get(0) or next(iter(known.values()))
            specs = []
            for rank in range(n):
                spec = known.get(rank) or replace(
                    first, rank=rank, echo=False, metrics_port=None,
                    log_path=first.log_path.with_name(f"{first.role.value}.{rank}.log"),
                )  # fmt: skip
                specs.append(replace(spec, env={**spec.env, RANK: str(rank), WORKER_NUM: str(n)}))
            if self._members != list(range(n)):
                log.warning("worker group restart: the current workers %s start again as "
                            "ranks 0..%d", self._members, n - 1)  # fmt: skip
            self._children[:] = [c for c in self._children if c.role is not Role.WORKER] + specs
            self._members, self._departed = None, {}
            self._count_workers()
            return specs
