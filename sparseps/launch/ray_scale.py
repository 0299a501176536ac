"""``sparseps scale LOG_DIR --servers N | --workers N`` on a ``--backend ray`` job: the Ray side.

The protocol, the migration, the drain and the workers' membership are
:mod:`sparseps.launch.scaling`'s, shared with the local launcher; this module gives
:class:`~sparseps.launch.scaling.JobScaler` what differs under Ray (:class:`RayRoles`,
the supervisor-side methods the scaler calls):

- a new server gets its own placement group (a group cannot grow) of one
  ``--server-resources`` bundle and a :class:`~sparseps.launch.ray_actor.RoleActor` in
  it; the actor checks the role's paths and picks the server's port on its node, and the
  scaler takes the endpoint from the actor; the process starts with the job's
  environment contract and ``SPARSEPS_SERVERS`` = the job's list plus the new endpoints,
  is recorded in ``pids.json`` (with its ``node``) and supervised like the others;
- a removed server is *retired* (its exit is planned: the driver's failure check and final
  stop skip it), asked to stop by the scaler, then its actor is ended and its own
  placement group removed (a server of the launch's group keeps its bundle);
- ``--workers N`` (an online async job, whose workers follow membership: the scaler
  refuses other jobs): each new worker rank gets its own placement group of one
  ``--worker-resources`` bundle and a role actor, placed *before* the new world is
  announced (:class:`RayScaler`: a worker Ray cannot place within
  ``--rendezvous-timeout-s`` refuses the scale and changes nothing); then the scaler
  writes ``elastic/workers`` and :meth:`RayRoles.add_child` starts the process with the
  environment of its rank in the job's spec grown to N workers and the *current*
  generation's rendezvous (``SPARSEPS_MASTER``), as the local launcher's ``new_worker``
  does. The driver re-reads its worker list every round (``RayJob.supervise``): the
  added worker is waited for, and the job completes once every worker ever started
  exited 0; workers above the new count exit 0 by themselves at their next pass boundary.
  A rank that joins again replaces its worker of an earlier world once that one exited 0
  (its actor ended, its group removed; while it still runs the scale is refused);
- a worker ``r > 0`` that dies in an online job that takes deaths as leaves is recorded
  by :meth:`ScaleService.worker_died` (``RayJob.worker_left``), as under the local launcher.

The control store listens on the driver's loopback address: ``sparseps scale`` runs
where ``LOG_DIR`` and the driver are (it checks the driver's pid).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any

from ..env import Role
from .ray_placement import (
    RoleHandle,
    new_actor,
    prepare_roles,
    release,
    role_paths,
    role_resources,
)
from .scaling import (
    JobScaler,
    NewServer,
    ScaleError,
    ScaleService,
)

__all__ = ["RayRoles", "RayScaler", "scale_service"]

log = logging.getLogger(__name__)

CONTROL_HOST = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class _NewWorker:
    """What :meth:`RayRoles.add_child` starts: worker ``rank`` in a world of ``world``."""

    role = Role.WORKER
    rank: int
    world: int


class RayRoles:
    """Starts and retires servers, and starts workers, of a running
    :class:`~sparseps.launch.ray_job.RayJob` for :class:`JobScaler` (module docstring)."""

    def __init__(self, job: Any) -> None:
        self.job = job
        # (role, rank) -> the placement group of an added server or worker
        self.groups: dict[tuple[Role, int], Any] = {}
        self.reserved: dict[int, tuple[Any, RoleHandle]] = {}  # placed workers, not started

    def _place(self, role: Role, ranks: list[int], resources: dict[str, float]) -> list[tuple]:
        """One placement group and actor per rank; ``(group, handle)`` pairs, prepared
        (paths checked, ports picked on each node). Released on any failure."""
        from ray.util.placement_group import placement_group

        job, ray = self.job, self.job.ray
        wait_s = max(1.0, float(job.launch.rendezvous_timeout_s))
        placed: list[tuple[Any, RoleHandle | None]] = []
        try:
            for rank in ranks:
                pg = placement_group([resources], strategy="SPREAD")
                placed.append((pg, None))
                if not pg.wait(int(wait_s)):
                    raise ScaleError(
                        f"scale: Ray could not place {role.value} {rank} ({resources}) within "
                        f"{wait_s:g} s (--rendezvous-timeout-s of the launch); the cluster has "
                        f"{ray.available_resources()}: add a node or free resources"
                    )
                actor = new_actor(ray, role, rank, job.job_id, resources, pg, 0)
                log_path = job.log_dir / f"{role.value}.{rank}.log"
                placed[-1] = (pg, RoleHandle(role, rank, actor, log_path))
            handles = [h for _, h in placed if h is not None]
            metrics = 1 if job.launch.metrics else 0
            ports = [metrics + (role is Role.SERVER) for _ in handles]
            prepare_roles(ray, handles, role_paths(job.launch, job.script), ports)
        except BaseException:
            for pg, h in placed:
                release(ray, pg, [h] if h is not None else [])
            raise
        return placed

    # -- servers --------------------------------------------------------------------------
    def add_servers(self, ranks: list[int], endpoints: list[str]) -> list[NewServer]:
        """Place, prepare and start servers ``ranks``; ``endpoints``: the job's list so far."""
        job = self.job
        resources, _ = role_resources(job.launch)
        placed = self._place(Role.SERVER, ranks, resources)
        handles = [h for _, h in placed]
        grown = [*endpoints, *(f"{h.host}:{h.ports[0]}" for h in handles)]
        try:
            job.start(handles, spec=dataclasses.replace(job.spec, servers=tuple(grown)))
        except BaseException:
            for pg, h in placed:
                release(job.ray, pg, [h])
            raise
        with job.lock:
            job.roles.extend(handles)
            self.groups.update({(Role.SERVER, h.rank): pg for pg, h in placed})
        log.info("scale: started server(s) %s at %s", ranks, grown[len(endpoints) :])
        return [NewServer(grown[h.rank], self._exited(h), str(h.log_path)) for h in handles]

    @staticmethod
    def _exited(h: RoleHandle):
        def exited() -> str | None:
            if h.running or h.code is None:
                return None
            return f"(pid {h.pid}) on node {h.host} exited with code {h.code}; see {h.log_path}"

        return exited

    def retire(self, role: Role, rank: int) -> None:
        """Plan the exit of server ``rank``: it neither fails the job nor is stopped at the end."""
        with self.job.lock:
            self.job.retired.add((role, rank))

    def wait_retired(self, timeout: float) -> None:
        """Wait for the retired servers to exit (the driver's loop polls them), stop the
        ones still running, then end their actors and added placement groups."""
        job = self.job
        with job.lock:
            handles = [r for r in job.roles if (r.role, r.rank) in job.retired]
        deadline = time.monotonic() + timeout
        while any(r.running for r in handles) and time.monotonic() < deadline:
            time.sleep(0.05)
        late = [r for r in handles if r.running]
        if late:
            log.warning("scale: retired server(s) %s still run after %g s; stopping them",
                        [r.rank for r in late], timeout)  # fmt: skip
            job.stop(late)
        for r in handles:
            if r.running:
                continue
            group = self.groups.pop((r.role, r.rank), None)
            with contextlib.suppress(Exception):  # already gone
                job.ray.kill(r.actor, no_restart=True)
            if group is not None:
                release(job.ray, group, [])

    # -- workers (JobScaler.workers) ------------------------------------------------------
    def reserve_workers(self, ranks: list[int]) -> None:
        """Place workers ``ranks`` before the new world is announced: a worker Ray cannot
        place refuses the scale (ScaleError) and nothing changes."""
        _, resources = role_resources(self.job.launch)
        for rank in ranks:
            self._drop_exited(rank)
        for pg, h in self._place(Role.WORKER, ranks, resources):
            self.reserved[h.rank] = (pg, h)

    def _drop_exited(self, rank: int) -> None:
        """A rank that joins again: its worker of an earlier world, which exited 0, is
        forgotten (its actor ended, its group removed; ``pids.json`` keeps it). One that
        still runs refuses the scale (its actor holds the rank's name)."""
        job = self.job
        with job.lock:
            same = [r for r in job.roles if (r.role, r.rank) == (Role.WORKER, rank)]
            if any(r.running or r.code != 0 for r in same):
                raise ScaleError(
                    f"scale --workers: worker {rank} of an earlier world has not exited yet "
                    "(it leaves at its next pass boundary); scale again once it has"
                )
            job.roles[:] = [r for r in job.roles if r not in same]
        for old in same:
            release(job.ray, self.groups.pop((Role.WORKER, rank), None), [old])

    def release_reserved(self) -> None:
        """End the placed workers that were not started (a refused or failed scale)."""
        while self.reserved:
            _, (pg, h) = self.reserved.popitem()
            release(self.job.ray, pg, [h])

    def new_worker(self, rank: int, world: int) -> _NewWorker:
        """The scaler's ``new_worker``: what :meth:`add_child` starts."""
        return _NewWorker(rank, world)

    def master(self) -> str:
        """The workers' rendezvous store of the running generation."""
        return str(self.job.master)

    def add_child(self, new: _NewWorker) -> RoleHandle:
        """Start worker ``new.rank`` (placed by :meth:`reserve_workers`, or now) with its
        rank's environment in the job's spec grown to ``new.world`` workers and the
        current rendezvous; the driver waits for it from the next round."""
        job = self.job
        if new.rank in self.reserved:
            pg, h = self.reserved.pop(new.rank)
        else:
            self._drop_exited(new.rank)
            _, resources = role_resources(job.launch)
            ((pg, h),) = self._place(Role.WORKER, [new.rank], resources)
        spec = job.spec
        hosts = list(spec.workers[: new.world])
        hosts += [h.host] * (new.world - len(hosts))
        hosts[new.rank] = h.host
        grown = dataclasses.replace(spec, workers=tuple(hosts))
        # the request holds the job's completion (begin_change): the worker joins the
        # driver's list before it starts, and the job waits for it
        with job.lock:
            job.roles.append(h)
            h.attempt = job.restarts
        try:
            job.start([h], master=self.master(), spec=grown)
        except BaseException:
            with job.lock:
                job.roles[:] = [r for r in job.roles if r is not h]
            release(job.ray, pg, [h])
            raise
        self.groups[(Role.WORKER, new.rank)] = pg
        log.info("scale: started worker %d of %d on %s (rendezvous %s)", new.rank, new.world,
                 h.host, self.master())  # fmt: skip
        return h

    def begin_change(self) -> str:
        return self.job.begin_change()

    def end_change(self) -> None:
        self.job.end_change()

    def set_world(self, count: int) -> None:
        """The job's worker count is now ``count``: workers above it exit 0 by themselves,
        and the driver completes once every worker ever started exited 0."""
        log.info("scale: the workers' world is now %d", count)


class RayScaler(JobScaler):
    """:class:`JobScaler` whose ``--workers`` places the new workers' actors before the
    new world is announced (a worker that cannot be placed then changes nothing)."""

    def _reserve_workers(self, ranks: list[int]) -> None:
        roles = self.supervisor
        assert isinstance(roles, RayRoles)
        roles.reserve_workers(ranks)

    def _release_reserved(self) -> None:
        roles = self.supervisor
        assert isinstance(roles, RayRoles)
        roles.release_reserved()


def scale_service(job: Any) -> ScaleService:
    """The control store and scaler of a placed and wired job; its address and key
    folder go to ``pids.json``; a dead worker of an online job may leave."""
    roles = RayRoles(job)
    scaler = RayScaler(
        supervisor=roles, endpoints=list(job.spec.servers), job_id=job.job_id,
        security=job.security, launch_servers=roles.add_servers,
        new_worker=roles.new_worker, master=roles.master,
    )  # fmt: skip
    service = ScaleService(
        scaler, CONTROL_HOST, security=job.security, workers=len(job.spec.workers)
    )
    job.scaler = scaler
    job.worker_left = service.worker_died
    job.extra_record["control"] = service.address
    if job.spec.key_dir:
        job.extra_record["key_dir"] = job.spec.key_dir
    return service
