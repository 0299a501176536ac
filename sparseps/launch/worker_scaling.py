"""``sparseps scale --workers`` and a worker's leave: the launcher's side of the workers'
membership (issue 23; the contract with the workers' side: docs/elastic.md "Workers
joining and leaving").

The launcher and an online job's workers agree on who the workers are through one
record in the workers' store, ``elastic/workers`` (:mod:`sparseps.store.worker_keys`):
``{"version", "world"}`` and, once a worker died and left, ``members`` and ``left``.
The launcher writes it (a scale to N workers, a dead worker's leave); the workers read
it at their pass boundaries. Worker scaling is this record plus starting the new ranks:
nothing moves on the servers, which is why it lives apart from the server moves of
:mod:`sparseps.launch.scaling`.

:class:`WorkerScaling` is the worker half of
:class:`~sparseps.launch.scaling.JobScaler` (a mixin: the Ray scaler overrides its
reservation hooks, and both halves share the scaler's settings: the workers' store
address, the job's keys, the supervisor that starts processes).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import SparsePSError
from ..store.client import StoreClient
from ..store.worker_keys import (
    ACCEPTS_WORKERS_KEY,
    FIXED_KEY,
    LEAVES_KEY,
    MEMBERS_PREFIX,
    WORKERS_KEY,
)
from .scale_error import ScaleError

__all__ = ["WorkerScaling", "plan_workers"]

log = logging.getLogger(__name__)


def plan_workers(held: dict, count: int) -> tuple[list[int], list[int], dict]:
    """The members after a scale to ``count`` workers, from ``held`` (``elastic/workers``
    as it stands: ``{"version", "world"}`` and, once a worker died and left, ``members``
    and ``left``). Returns ``(members, left, record)``, ``record`` being the new value of
    ``elastic/workers`` (version + 1).

    A shrink keeps the lowest ``count`` member ranks (the highest leave at their next pass
    boundary). A grow starts the lowest ranks that are neither members nor in ``left``:
    ``old..count-1`` while no worker died; a dead worker's rank is never used again (a
    launch rank names one process for the job's life: the fence takes a member named in
    ``left`` for dead, and logs, steal heartbeats and file owners keep meaning one
    process). ``members`` and ``left`` stay in the record once a worker left.
    """
    members = sorted(int(r) for r in held.get("members", range(int(held["world"]))))
    left = sorted(int(r) for r in held.get("left", []))
    if count <= len(members):
        members = members[:count]
    else:
        taken, rank = {*members, *left}, 0
        while len(members) < count:
            if rank not in taken:
                members.append(rank)
            rank += 1
        members.sort()
    record: dict = {"version": int(held["version"]) + 1, "world": count}
    if left or members != list(range(count)):
        record.update(members=members, left=left)
    return members, left, record


def _held(store, current: int) -> dict:
    """``elastic/workers`` as it stands (``{"version": 0, "world": current}`` before any
    scale or leave was recorded)."""
    if store.check([WORKERS_KEY]):
        return json.loads(store.get(WORKERS_KEY))
    return {"version": 0, "world": current}


def _ended(store) -> bool:
    """Whether worker 0 of an online job wrote its ``end`` decision: no pass boundary is
    left where a new worker could join (:mod:`sparseps.online.membership`)."""
    latest = f"{MEMBERS_PREFIX}/latest"
    if not store.check([latest]):
        return False
    key = f"{MEMBERS_PREFIX}/decision/{int(store.get(latest))}"
    return store.check([key]) and bool(json.loads(store.get(key)).get("end"))


@dataclass(frozen=True)
class WorkerScaling:
    """Resizes the workers of a running launch and records a dead worker's leave
    (module docstring); the worker half of a :class:`~sparseps.launch.scaling.JobScaler`,
    which holds one.

    Args:
        supervisor: starts the new workers (``add_child``) and follows the world
            (``set_world``).
        new_worker: builds the ChildSpec of worker ``rank`` in a world of ``N`` workers.
        master: the workers' rendezvous store now (``host:port``), for the membership key.
        security: the job's CURVE keys (None: plain).
        workers_refused: why ``--workers`` is refused by this launcher ("" if served).
    """

    supervisor: Any  # the local Supervisor, Ray's RayRoles, or None (tests)
    new_worker: Callable[[int, int], object] | None = None
    master: Callable[[], str] | None = None
    security: object = None
    workers_refused: str = ""

    def workers(self, count: int, current: int) -> dict:
        """Announce a world of ``count`` workers and start the new ranks (the contract in
        docs/elastic.md); ``current`` is the world before."""
        if count < 1:
            raise ScaleError(f"scale --workers {count}: a job needs at least one worker")
        if self.workers_refused:
            raise ScaleError(f"scale --workers: {self.workers_refused}")
        if self.master is None:
            raise ScaleError("scale --workers: this launcher does not know the workers' store")
        master = self.master()
        try:
            store = StoreClient(master, timeout_s=5.0, setting="-", what="rendezvous store",
                             security=self.security)  # fmt: skip
        except SparsePSError as exc:
            raise ScaleError(f"scale --workers: the workers' store at {master} does not answer "
                             f"({exc}); are the workers running?") from None  # fmt: skip
        try:
            if not store.check([ACCEPTS_WORKERS_KEY]):
                raise ScaleError(
                    "scale --workers: worker scaling needs a job whose workers follow "
                    "membership changes, i.e. `sparseps online`; this job's workers did not "
                    f"set {ACCEPTS_WORKERS_KEY!r} in their store at {master}"
                )
            if self.new_worker is None:
                raise ScaleError("scale --workers: this launcher cannot start workers")
            if _ended(store):
                raise ScaleError(
                    "scale --workers: the job is finishing: its last pass is done (worker 0 "
                    "wrote the end decision), so no pass is left for a new worker; run the "
                    "job again with job.worker_num to go on"
                )
            held = _held(store, current)
            version = int(held["version"])
            members, left, record = plan_workers(held, count)
            old = [int(r) for r in held.get("members", range(int(held["world"])))]
            started = [r for r in members if r not in old]
            self._reserve_workers(started)  # may refuse: nothing is announced yet
            try:
                store.set(WORKERS_KEY, json.dumps(record).encode())
            except BaseException:
                self._release_reserved()
                raise
        finally:
            store.close()
        new_worker = self.new_worker
        assert new_worker is not None  # checked above, before anything was announced
        # a launch rank need not be below the world once a worker left: the new process's
        # worker count covers the highest member (SPARSEPS_RANK < SPARSEPS_WORKER_NUM)
        worker_num = max(members) + 1
        try:
            for rank in started:
                self.supervisor.add_child(new_worker(rank, worker_num))
            self.supervisor.set_world(count)
        finally:
            self._release_reserved()
        report = {"workers_before": len(old), "workers_after": count, "workers_started": started,
                  "version": version + 1}  # fmt: skip
        if "members" in record:
            report.update(members=members, left=left)
        return report

    def _reserve_workers(self, ranks: list[int]) -> None:
        """Before a world with new workers ``ranks`` is announced: hold what starting them
        needs (the Ray launcher places their actors), or refuse with ScaleError."""

    def _release_reserved(self) -> None:
        """After the scale: let go of what :meth:`_reserve_workers` held and was not used."""

    def worker_died(self, rank: int, current: int) -> str | None:
        """Record that worker ``rank`` died as a leave: ``elastic/workers`` gets version
        + 1, ``members`` without it and ``left`` with it (:mod:`sparseps.online.leaving`).
        Returns "" when recorded, else why the job cannot go on without it (nothing is
        written), or None when its workers do not follow membership at all (not an
        online job: nothing to say). ``current`` is the world when no scale was recorded
        yet."""
        if rank == 0 or self.master is None:
            # worker 0 hosts the workers' store (and an online job's ledger): its death
            # ends the job as it always did
            return None
        master = self.master()
        try:
            store = StoreClient(master, timeout_s=2.0, setting="-", what="rendezvous store",
                             security=self.security)  # fmt: skip
        except SparsePSError as exc:
            return f"the workers' store at {master} does not answer ({exc})"
        try:
            if store.check([FIXED_KEY]):  # an online job in sync or geo mode
                return store.get(FIXED_KEY).decode(errors="replace")
            if not store.check([LEAVES_KEY]):
                if not store.check([ACCEPTS_WORKERS_KEY]):
                    return None  # not a job that follows membership: fails as it always did
                return (
                    "this async online job does not take a worker's death as a leave: that "
                    "needs data.split: steal and data.lease_s; rerun the job to resume from "
                    "its newest checkpoint"
                )
            held = _held(store, current)
            members = [int(r) for r in held.get("members", range(int(held["world"])))]
            members = [r for r in members if r != rank]
            left = sorted({*(int(r) for r in held.get("left", [])), rank})
            record = {"version": int(held["version"]) + 1, "world": len(members),
                      "members": members, "left": left}  # fmt: skip
            store.set(WORKERS_KEY, json.dumps(record).encode())
        except (SparsePSError, ValueError, KeyError, TypeError) as exc:
            return f"recording its leave in the workers' store at {master} failed ({exc})"
        finally:
            store.close()
        log.warning("worker %d died: recorded as a leave (%s = %s)", rank, WORKERS_KEY, record)
        return ""
