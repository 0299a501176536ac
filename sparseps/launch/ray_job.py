"""One job on a Ray cluster (:class:`RayJob`): its roles' placement, start, supervision
with the local launcher's rules, and teardown; :mod:`sparseps.launch.ray_backend` (the
module docstring tells the driver's steps) makes one and runs it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..core.closing import Closing
from ..env import Role, process_environ
from .change_gate import ChangeGate
from .config import LaunchConfig
from .heter_devices import heter_device_env
from .procutil import tail
from .ray_placement import (
    CALL_TIMEOUT_S,
    RoleHandle,
    call,
    key_dir_rule,
    place_roles,
    release,
)
from .records import SERVER_EXIT_NOTE, Failure, Outcome, SupervisorConfig
from .spec import ClusterSpec, new_job_id

__all__ = ["RayJob"]

log = logging.getLogger(__name__)


def _status(code: int) -> int:
    """A process's return code as a shell exit status (signal N -> 128+N)."""
    return 128 - code if code < 0 else code


class RayJob(Closing):
    """One job on a Ray cluster: placement, start, supervision, teardown."""

    def __init__(self, launch: LaunchConfig, script: Path, out) -> None:
        import ray

        self.ray, self.launch, self.script, self.out = ray, launch, script, out
        self.config = SupervisorConfig(
            max_restarts=launch.max_restarts, grace_s=launch.grace_s,
            quiet_warn_s=launch.quiet_warn_s,
        )  # fmt: skip
        self.log_dir = Path(os.path.abspath(launch.log_dir))
        self.job_id = launch.job_id or new_job_id("sps-ray")
        self.roles: list[RoleHandle] = []
        self.history: list[dict] = []
        self.restarts = 0
        self.heter_restarts: dict[int, int] = {}  # heter worker rank: restarts used
        self.signum: int | None = None
        self.pg = None
        self.spec: ClusterSpec | None = None
        self.security: Any = None  # a sparseps.rpc.security.Security when secure
        # sparseps scale (ray_scale.py): roles and pids.json change from its thread
        self.lock = threading.RLock()
        self.retired: set[tuple[Role, int]] = set()  # drained servers: planned exits
        self.extra_record: dict[str, Any] = {}  # pids.json: the control store's address
        self.scaler: Any = None  # a sparseps.launch.scaling.JobScaler once served
        self.master = ""  # the workers' rendezvous of the running generation
        # a worker's ClusterSpec when not the launch's (added by a scale: its grown world)
        self.worker_specs: dict[int, ClusterSpec] = {}
        self.left: set[int] = set()  # ranks of workers that died and left (online jobs)
        # asked when a worker exits non-zero (ScaleService.worker_died): "" = it left
        self.worker_left: Any = None
        # scale requests in flight (begin_change): the job waits for them; once every
        # worker exited 0 with none in flight, none is admitted any more
        self._gate = ChangeGate(self.lock)

    # -- placement and wiring -------------------------------------------------------------
    def place(self) -> None:
        self.pg, self.roles = place_roles(
            self.ray, self.launch, self.job_id, self.script, self.log_dir
        )

    def wire(self) -> ClusterSpec:
        servers = tuple(f"{r.host}:{r.ports[0]}" for r in self.roles if r.role is Role.SERVER)
        heter = tuple(f"{r.host}:{r.ports[0]}" for r in self.roles if r.role is Role.HETER_WORKER)
        workers = [r for r in self.roles if r.role is Role.WORKER]
        spec = ClusterSpec(
            servers=servers,
            heter_workers=heter,
            workers=tuple(r.host for r in workers),
            master=f"{workers[0].host}:{workers[0].ports[0]}",
            host=workers[0].host,
            job_id=self.job_id,
            log_dir=str(self.log_dir),
        )
        self.master = spec.master
        key_dir = key_dir_rule(
            self.launch, spec.nodes, str(self.ray.util.get_node_ip_address()), self.log_dir
        )
        if key_dir:
            from ..rpc.security import JobKeys, Security

            spec = dataclasses.replace(spec, key_dir=key_dir)
            self.security = Security(JobKeys.load(key_dir))
        self.spec = spec
        return spec

    def banner(self) -> str:
        assert self.spec is not None
        lines = [
            "----------- sparseps launch (ray) -----------",
            f"job id      : {self.job_id}",
            f"servers     : {len(self.spec.servers)}",
            *(f"  server {r}: {ep}" for r, ep in enumerate(self.spec.servers)),
            *(f"  heter worker {r}: {ep}" for r, ep in enumerate(self.spec.heter_workers)),
            f"workers     : {len(self.spec.workers)}",
            *(f"  worker {r}: {h}" for r, h in enumerate(self.spec.workers)),
            f"rendezvous  : {self.spec.master}",
            f"log dir     : {self.log_dir}",
            f"transport   : {'CURVE, keys in ' + self.spec.key_dir if self.spec.secure else 'plain'}",
            "---------------------------------------------",
        ]
        return "\n".join(lines)

    # -- processes ------------------------------------------------------------------------
    def _env(
        self, r: RoleHandle, master: str | None = None, spec: ClusterSpec | None = None
    ) -> dict[str, str]:
        if spec is None and r.role is Role.WORKER:
            spec = self.worker_specs.get(r.rank)
        spec = spec or self.spec
        assert spec is not None
        role_env = spec.role_env(r.role, r.rank)
        if r.role is Role.WORKER:
            role_env = dataclasses.replace(
                role_env, restart_count=r.attempt, master=master or role_env.master
            )
        # what the local launcher's children get: the job's settings, then the role's
        env = {**self.launch.child_settings(), **role_env.to_environ(), "PYTHONUNBUFFERED": "1"}
        if self.launch.heter_device:  # each heter worker its own device
            env = heter_device_env(env, r.role, r.rank, len(spec.heter_workers))
        threads = process_environ().get("OMP_NUM_THREADS")
        if threads is not None:
            env["OMP_NUM_THREADS"] = threads
        return env

    def start(
        self, roles: list[RoleHandle], master: str | None = None, spec: ClusterSpec | None = None
    ) -> None:
        """Start ``roles``' processes (``spec``: a scaled job's grown server list, or an
        added worker's grown world, which that worker keeps across group restarts)."""
        calls = []
        for r in roles:
            metrics = r.ports[-1] if self.launch.metrics else None
            observe = ["--metrics-port", str(metrics), "--metrics-host", r.host] if metrics else []
            argv = [*observe, str(self.script), *self.launch.script_args]
            calls.append(
                r.actor.start.remote(
                    argv, self._env(r, master, spec), cwd=os.getcwd(), attempt=r.attempt
                )
            )
        pids = self._get(calls, "start")
        with self.lock:
            if spec is not None:
                self.worker_specs.update({r.rank: spec for r in roles if r.role is Role.WORKER})
            for r, pid in zip(roles, pids, strict=True):
                r.pid, r.code, r.running = pid, None, True
                r.last_output = r.warned_at = time.monotonic()
                self.history.append({"role": r.role.value, "rank": r.rank, "pid": pid,
                                     "attempt": r.attempt, "node": r.host,
                                     **({"metrics_port": r.ports[-1]} if self.launch.metrics else {})})  # fmt: skip
            record = {"job_id": self.job_id, "launcher": os.getpid(), "backend": "ray",
                      **self.extra_record, "children": self.history}  # fmt: skip
            tmp = self.log_dir / "pids.json.tmp"
            tmp.write_text(json.dumps(record, indent=1))
            tmp.replace(self.log_dir / "pids.json")

    def poll(self, roles: list[RoleHandle]) -> None:
        """One round: exit codes and new log bytes of ``roles`` (until drained)."""
        pending = [r for r in roles if r.running]
        while pending:
            replies = self._poll_replies(pending)
            again = []
            for r, reply in zip(pending, replies, strict=True):
                if reply["data"]:
                    with open(r.log_path, "ab") as f:
                        f.write(reply["data"])
                    if r.role is Role.WORKER and r.rank == 0:
                        sys.stdout.buffer.write(reply["data"])
                        sys.stdout.flush()
                    r.last_output = time.monotonic()
                r.offset = reply["offset"]
                if reply["code"] is not None:
                    r.code, r.running = reply["code"], False
                if reply["more"]:
                    again.append(r)
            pending = again

    def _poll_replies(self, pending: list[RoleHandle]) -> list[dict]:
        """Each role's poll reply; a role whose actor died (its node lost, say) gets a
        reply with exit code -9 and is named as such."""
        from ray.exceptions import RayActorError

        try:
            return self._get([r.actor.poll.remote(r.offset) for r in pending], "poll", raw=True)
        except RayActorError:
            replies = []
            for r in pending:
                try:
                    replies.append(self._get([r.actor.poll.remote(r.offset)], "poll", raw=True)[0])
                except RayActorError:
                    r.actor_died = True
                    replies.append({"code": -9, "data": b"", "offset": r.offset, "more": False})
            return replies

    def stop(self, roles: list[RoleHandle]) -> None:
        live = [r for r in roles if r.running]
        if live:
            self._get([r.actor.stop.remote(self.config.grace_s) for r in live], "stop",
                      timeout=self.config.grace_s + CALL_TIMEOUT_S)  # fmt: skip
            self.poll(live)
            for r in live:  # a stopped process counts as exited, whatever poll saw
                r.running = False

    def _get(
        self, refs: list, what: str, timeout: float = CALL_TIMEOUT_S, *, raw: bool = False
    ) -> list:
        return call(self.ray, refs, what, timeout, raw=raw)

    # -- supervision ----------------------------------------------------------------------
    def _workers(self) -> list[RoleHandle]:
        """The workers the job waits for now: every one started (a scale adds some), less
        those that died and left."""
        with self.lock:
            return [r for r in self.roles if r.role is Role.WORKER and r.rank not in self.left]

    def supervise(self) -> Outcome:
        while True:
            with self.lock:  # a scale adds servers and workers, and retires servers
                roles = list(self.roles)
                servers = [r for r in roles
                           if r.role is Role.SERVER and (r.role, r.rank) not in self.retired]  # fmt: skip
            if self.signum is not None:
                self.stop(roles)
                return Outcome(128 + self.signum, "interrupted")
            self.poll(roles)
            dead_server = next((r for r in servers if not r.running), None)
            if dead_server is not None:
                return self._fail(dead_server, note=SERVER_EXIT_NOTE)
            heter = [r for r in roles if r.role is Role.HETER_WORKER]
            dead_heter = next((r for r in heter if not r.running), None)
            if dead_heter is not None and not self._restart_heter(dead_heter):
                return self._fail(dead_heter, note=SERVER_EXIT_NOTE.replace(
                    "a server exit", "a heter worker exit"))  # fmt: skip
            workers = self._workers()
            failed = next((r for r in workers if r.code not in (None, 0)), None)
            if failed is not None:
                time.sleep(self.config.poll_s)  # a worker that failed because a server died
                self.poll(servers)
                dead_server = next((r for r in servers if not r.running), None)
                if dead_server is not None:
                    return self._fail(dead_server, note=SERVER_EXIT_NOTE)
                if self._left(failed):
                    continue
                if self.restarts >= self.config.max_restarts:
                    return self._fail(failed)
                self._restart(failed, workers)
                continue
            with self.lock:  # a scale may be adding a worker: it is in roles before it starts
                workers = self._workers()
                done = self._gate.finish(done=all(r.code == 0 for r in workers))
            if done:
                self.stop(heter)  # SIGTERM: a heter worker exits 0
                self._stop_servers(servers)
                return Outcome(0, "completed")
            self._warn_quiet()
            time.sleep(self.config.poll_s * 2)

    @property
    def finishing(self) -> bool:
        """Every worker exited 0 with no scale request in flight: the job completes, and
        no request is admitted any more."""
        return self._gate.finishing

    def begin_change(self) -> str:
        """A scale request starts: "" when it may go on (the job does not complete until
        :meth:`end_change`), else why not (the job is finishing), as the local
        launcher's :meth:`Supervisor.begin_change <sparseps.launch.supervisor.Supervisor.begin_change>`."""
        return self._gate.begin()

    def end_change(self) -> None:
        """The scale request that :meth:`begin_change` admitted is done."""
        self._gate.end()

    def _left(self, r: RoleHandle) -> bool:
        """Whether worker ``r``, exited non-zero, left the job (``worker_left``, the local
        supervisor's rule): the job goes on and completes without it."""
        if self.worker_left is None:
            return False
        assert r.code is not None, "asked once it exited"
        try:
            why = self.worker_left(r.rank, r.code)
        except Exception as exc:  # noqa: BLE001 - never kill the driver; the job fails as before
            why = f"recording its leave failed: {type(exc).__name__}: {exc}"
        if why is None:
            return False
        if why:
            log.error("%s (pid %d) on %s exited with code %d and the job cannot go on without "
                      "it: %s", r.name, r.pid, r.host, r.code, why)  # fmt: skip
            return False
        with self.lock:
            self.left.add(r.rank)
        log.warning("%s (pid %d) on %s exited with code %d: it LEFT the job (recorded in the "
                    "workers' membership); the other workers finish its pass and go on "
                    "without it", r.name, r.pid, r.host, r.code)  # fmt: skip
        return True

    def _warn_quiet(self) -> None:
        """Name a running role that has written nothing for ``--quiet-warn-s`` (again every
        period), as the local launcher does: a hung role shows before any timeout."""
        now, period = time.monotonic(), self.config.quiet_warn_s
        for r in list(self.roles):
            last = max(r.last_output, r.warned_at)
            if r.running and now - last >= period:
                r.warned_at = now
                log.warning("%s (pid %d) on %s has produced no output for %.0f s",
                            r.name, r.pid, r.host, now - r.last_output)  # fmt: skip

    def _fail(self, r: RoleHandle, note: str = "") -> Outcome:
        self.stop(list(self.roles))
        code = r.code if r.code is not None else 0
        died = "(its Ray actor died: node lost or actor killed)" if r.actor_died else ""
        left = ""
        if self.config.max_restarts and r.role is Role.WORKER:
            left = f"(no restarts left: {self.restarts} of {self.config.max_restarts} used)"
        failure = Failure(
            role=r.role.value, rank=r.rank, pid=r.pid, exit_code=code,
            log_path=str(r.log_path), tail=tuple(tail(r.log_path, self.config.tail_lines)),
            note=" ".join(part for part in (f"on node {r.host}", died, note, left) if part),
        )  # fmt: skip
        status = _status(code) or 1
        return Outcome(status, "failed", failure)

    def _restart_heter(self, r: RoleHandle) -> bool:
        """Start heter worker ``r`` again on its actor (same node, same port) while
        ``--max-restarts`` allows, as the local launcher does (docs/heterps.md): its
        trainers count the steps they had in flight to it as lost and wait for it."""
        used = self.heter_restarts.get(r.rank, 0)
        if used >= self.config.max_restarts or r.actor_died:  # actor died: its node is gone
            return False
        self.heter_restarts[r.rank] = used + 1
        log.warning(
            "%s (pid %d) on %s exited with code %s: restarting it (heter worker restart %d of "
            "%d; its trainers lose the steps they had in flight to it)",
            r.name, r.pid, r.host, r.code, used + 1, self.config.max_restarts,
        )  # fmt: skip
        r.attempt = used + 1
        self.start([r])
        return True

    def _restart(self, failed: RoleHandle, workers: list[RoleHandle]) -> None:
        self.restarts += 1
        log.warning(
            "%s (pid %d) on %s exited with code %d: restarting all workers (restart %d of %d; "
            "servers keep running)", failed.name, failed.pid, failed.host, failed.code,
            self.restarts, self.config.max_restarts,
        )  # fmt: skip
        self.stop(workers)
        port = self._get([workers[0].actor.free_ports.remote(1)], "free_ports")[0][0]
        master = f"{workers[0].host}:{port}"
        for r in workers:
            r.attempt = self.restarts
        self.master = master
        self.start(workers, master)
        log.info("worker group restart %d of %d: started worker(s) %s, rendezvous %s",
                 self.restarts, self.config.max_restarts,
                 ",".join(str(r.rank) for r in workers), master)  # fmt: skip

    def _stop_servers(self, servers: list[RoleHandle]) -> None:
        from ..rpc.stop import stop_servers  # the wire alone: no table code, no numba

        assert self.spec is not None
        endpoints = list(self.spec.servers)
        ranks = list(range(len(endpoints)))
        if self.scaler is not None:  # a scaled job: its live servers only
            with self.lock:
                endpoints, ranks = list(self.scaler.endpoints), list(self.scaler.live)
        try:
            stop_servers(endpoints, ranks, timeout=self.config.server_stop_s,
                         job_id=self.job_id, security=self.security)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - SIGTERM below stops them anyway
            log.warning("stop request to the servers failed (%s); sending SIGTERM", exc)
        deadline = time.monotonic() + self.config.server_stop_s
        while any(r.running for r in servers) and time.monotonic() < deadline:
            self.poll(servers)
            time.sleep(0.1)
        self.stop(servers)

    def close(self) -> None:
        release(self.ray, self.pg, list(self.roles))
        if self.scaler is not None:  # the added servers' own placement groups
            for group in self.scaler.supervisor.groups.values():
                release(self.ray, group, [])
