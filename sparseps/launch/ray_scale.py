"""``sparseps scale LOG_DIR --servers N`` on a ``--backend ray`` job: the Ray side.

The protocol, the migration and the drain are :mod:`sparseps.launch.scaling`'s, shared
with the local launcher; this module gives :class:`~sparseps.launch.scaling.JobScaler`
what differs under Ray:

- a new server gets its own placement group (a group cannot grow) of one
  ``--server-resources`` bundle and a :class:`~sparseps.launch.ray_actor.RoleActor` in
  it; the actor checks the role's paths and picks the server's port on its node, and the
  scaler takes the endpoint from the actor; the process starts with the job's
  environment contract and ``SPARSEPS_SERVERS`` = the job's list plus the new endpoints,
  is recorded in ``pids.json`` (with its ``node``) and supervised like the others;
- a removed server is *retired* (its exit is planned: the driver's failure check and final
  stop skip it), asked to stop by the scaler, then its actor is ended and its own
  placement group removed (a server of the launch's group keeps its bundle);
- ``--workers`` is refused: the Ray backend does not run ``sparseps online`` jobs' worker
  membership yet.

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
from .scaling import JobScaler, NewServer, ScaleError, ScaleService

__all__ = ["RayServers", "scale_service"]

log = logging.getLogger(__name__)

CONTROL_HOST = "127.0.0.1"
WORKERS_REFUSED = (
    "worker scaling is not supported with --backend ray yet (the Ray driver does not "
    "start workers mid-job); launch with the local launcher to scale workers"
)


class RayServers:
    """Starts and retires servers of a running :class:`~sparseps.launch.ray_backend.RayJob`
    for :class:`JobScaler` (module docstring)."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.groups: dict[int, Any] = {}  # rank -> the placement group of an added server

    def add_servers(self, ranks: list[int], endpoints: list[str]) -> list[NewServer]:
        """Place, prepare and start servers ``ranks``; ``endpoints``: the job's list so far."""
        from ray.util.placement_group import placement_group

        job, ray = self.job, self.job.ray
        resources, _ = role_resources(job.args)
        wait_s = max(1.0, float(job.args.rendezvous_timeout_s))
        placed: list[tuple[Any, RoleHandle | None]] = []
        try:
            for rank in ranks:
                pg = placement_group([resources], strategy="SPREAD")
                placed.append((pg, None))
                if not pg.wait(int(wait_s)):
                    raise ScaleError(
                        f"scale: Ray could not place server {rank} ({resources}) within "
                        f"{wait_s:g} s (--rendezvous-timeout-s of the launch); the cluster has "
                        f"{ray.available_resources()}: add a node or free resources"
                    )
                actor = new_actor(ray, Role.SERVER, rank, job.job_id, resources, pg, 0)
                log_path = job.log_dir / f"server.{rank}.log"
                placed[-1] = (pg, RoleHandle(Role.SERVER, rank, actor, log_path))
            handles = [h for _, h in placed if h is not None]
            ports = [2 if job.args.metrics else 1] * len(handles)
            prepare_roles(ray, handles, role_paths(job.args, job.script), ports)
            grown = [*endpoints, *(f"{h.host}:{h.ports[0]}" for h in handles)]
            job.start(handles, spec=dataclasses.replace(job.spec, servers=tuple(grown)))
        except BaseException:
            for pg, h in placed:
                release(ray, pg, [h] if h is not None else [])
            raise
        with job.lock:
            job.roles.extend(handles)
            self.groups.update({h.rank: pg for pg, h in placed if h is not None})
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
            group = self.groups.pop(r.rank, None)
            with contextlib.suppress(Exception):  # already gone
                job.ray.kill(r.actor, no_restart=True)
            if group is not None:
                release(job.ray, group, [])


def scale_service(job: Any) -> ScaleService:
    """The control store and scaler of a placed and wired job; its address and key
    folder go to ``pids.json``."""
    servers = RayServers(job)
    scaler = JobScaler(
        supervisor=servers, endpoints=list(job.spec.servers), job_id=job.job_id,
        security=job.security, launch_servers=servers.add_servers,
        workers_refused=WORKERS_REFUSED,
    )  # fmt: skip
    service = ScaleService(
        scaler, CONTROL_HOST, security=job.security, workers=len(job.spec.workers)
    )
    job.scaler = scaler
    job.extra_record["control"] = service.address
    if job.spec.key_dir:
        job.extra_record["key_dir"] = job.spec.key_dir
    return service
