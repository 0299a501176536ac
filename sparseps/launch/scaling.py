"""``sparseps scale`` on a running launch: the launcher's side (issue 23).

One-node local launches and ``--backend ray`` jobs share this module: they differ only
in how a new server starts (:attr:`JobScaler.launch_servers`; the Ray backend places an
actor per new server, ``RayJob.add_servers``). The launcher hosts a small *control store* (a :class:`~sparseps.store.server.StoreServer`
on its host, its address in ``LOG_DIR/pids.json`` as ``control``). ``sparseps scale``
(:mod:`sparseps.launch.scale_cli`) takes the lock ``scale/busy`` (an ``add`` that must
answer 1: one scale at a time), writes ``scale/request`` = JSON ``{"id", "servers",
"workers"}`` and waits for ``scale/result/<id>``; :class:`ScaleService` serves it here.

Servers (:meth:`JobScaler.servers`), growing S -> N:

1. start server processes for the new ranks (locally on free ports; under Ray on the
   port the new actor picked on its node; recorded in ``pids.json``, logs
   ``server.R.log``), their ``SPARSEPS_SERVERS`` the job's list plus the new ones;
2. wait until each answers a ping;
3. on the first scale, install the default placement on the job's servers (it routes
   exactly as ``server_of(key, S)``: no row moves);
4. rebalance over the live ranks and migrate (:func:`sparseps.elastic.scale`) while the
   workers keep training; their clients follow the new placement (:mod:`sparseps.elastic.routing`).

Shrinking N < S drains the highest live ranks (refused when one holds a dense table:
dense tables stay on ``dense_server_of(name, S_start)``), waits ``DRAIN_LINGER_S`` so
training clients see the drained servers' refusals and move on, then stops them: their
exit is planned (:meth:`Supervisor.retire`), and the job's final stop skips them.

Workers (:meth:`JobScaler.workers`, a dead worker's leave): the other half of a scale,
:mod:`sparseps.launch.worker_scaling`. The halves share the request, the scaler's
settings and the supervisor, not their rules: a server scale moves rows between servers
through placements, a worker scale only rewrites the workers' membership record and
starts processes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.closing import Closing
from ..env import Role
from ..errors import SparsePSError
from ..store.client import StoreClient
from ..store.server import StoreServer
from ..store.worker_keys import ACCEPTS_WORKERS_KEY, WORKERS_KEY
from .scale_error import ScaleError
from .worker_scaling import WorkerScaling, plan_workers

if TYPE_CHECKING:
    from ..core.placement import Placement
    from ..elastic.peers import Peers

__all__ = [
    "ACCEPTS_WORKERS_KEY",
    "DRAIN_LINGER_S",
    "WORKERS_KEY",
    "JobScaler",
    "NewServer",
    "ScaleError",
    "ScaleService",
    "plan_workers",
]

log = logging.getLogger(__name__)

# Seconds a drained server keeps refusing requests before it is stopped: clients that
# are training meet a refusal, refresh their placement and never wait on a dead server.
DRAIN_LINGER_S = 1.0
SERVER_READY_S = 60.0


@dataclass(frozen=True)
class NewServer:
    """A server a launcher started for a scale: where it listens, and whether it died.

    Args:
        endpoint: ``host:port`` it listens on (chosen where it runs).
        exited: None while it runs; once it exited, what happened (pid, exit code, log).
        log_path: its log, named when it does not answer in time.
    """

    endpoint: str
    exited: Callable[[], str | None]
    log_path: str = ""


@dataclass
class JobScaler:
    """Adds and removes servers and workers of a running launch: one implementation for
    the local launcher and the Ray backend, which differ only in how a server starts.
    The server half is here, the worker half is :attr:`worker_scaling`
    (:class:`~sparseps.launch.worker_scaling.WorkerScaling`: ``workers``,
    ``worker_died``).

    Args:
        supervisor: the launch's supervisor (starts children, plans server exits: it
            has ``retire(role, rank)`` and ``wait_retired(timeout)``; ``add_child`` and
            ``set_world`` where it serves workers; ``begin_change()`` / ``end_change()``
            around each request, which hold the job's completion: the local
            :class:`~sparseps.launch.supervisor.Supervisor`, or Ray's ``RayRoles``).
        endpoints: the job's server endpoints at start (rank order).
        new_server: builds the :class:`ChildSpec` of server ``rank`` given the endpoint
            list it joins.
        new_worker: builds the ChildSpec of worker ``rank`` in a world of ``N`` workers.
        host: where new servers listen (the local launcher's own start).
        launch_servers: starts servers ``ranks`` that join ``endpoints`` (the job's list
            so far) some other way and returns them in rank order (the Ray backend:
            ``RayJob.add_servers``); None: ``new_server`` processes through ``supervisor``.
        workers_refused: why ``--workers`` is refused by this launcher ("" if served).
        job_id, security: the job's (for the clients that drive the servers).
        replicas: the job's ``--replicas`` (placements refuse them).
        master: the workers' rendezvous store now (``host:port``), for the membership key.
    """

    supervisor: Any  # the local Supervisor, Ray's RayRoles, or None (tests)
    endpoints: list[str]
    new_server: Callable[[int, list[str]], object] | None = None
    new_worker: Callable[[int, int], object] | None = None
    host: str = "127.0.0.1"
    job_id: str = ""
    security: object = None
    replicas: int = 0
    master: Callable[[], str] | None = None
    launch_servers: Callable[[list[int], list[str]], list[NewServer]] | None = None
    workers_refused: str = ""
    start_servers: int = field(init=False, default=0)
    workers_world: int | None = None

    def __post_init__(self) -> None:
        self.worker_scaling = WorkerScaling(
            supervisor=self.supervisor,
            new_worker=self.new_worker,
            master=self.master,
            security=self.security,
            workers_refused=self.workers_refused,
        )
        self.endpoints = list(self.endpoints)
        self.start_servers = len(self.endpoints)
        self.live = list(range(len(self.endpoints)))

    # -- servers -------------------------------------------------------------------------

    def _peers(self) -> Peers:
        # The elastic code (and the kernels it routes keys with) loads when a job is first
        # scaled: every one-node launch serves `sparseps scale`, few jobs use it.
        from ..elastic.peers import Peers

        # the job's servers by rank, so that an error names the right one
        return Peers(
            timeout=30.0, job_id=self.job_id or None, security=self.security,
            endpoints=self.endpoints,
        )  # fmt: skip

    def servers(self, count: int) -> dict:
        """Grow or shrink to ``count`` live servers; returns the report (module docstring)."""
        if count < 1:
            raise ScaleError(f"scale --servers {count}: a job needs at least one server")
        if self.replicas:
            raise ScaleError(
                f"scale --servers: this job runs with --replicas {self.replicas}; elastic "
                "placements do not support replicas yet (start the job without --replicas)"
            )
        before = len(self.live)
        start = time.perf_counter()
        report: dict = {"servers_before": before, "servers_after": count, "started": [],
                        "stopped": [], "vshards_moved": 0, "rows_moved": 0,
                        "longest_cutover_s": 0.0}  # fmt: skip
        if count == before:
            report["seconds"] = 0.0
            return report
        peers = self._peers()
        try:
            if count > before:
                new = self._start_servers(count - before)
                report["started"] = new
                ranks = [*self.live, *new]
            else:
                ranks = sorted(self.live)[:count]
                removed = sorted(self.live)[count:]
                self._check_dense(peers, removed)
            from ..core.placement import rebalance
            from ..elastic import migrate

            current = self._placement(peers)
            moved = migrate(peers, rebalance(current, ranks, self.endpoints))
            report.update(vshards_moved=moved.vshards_moved, rows_moved=moved.rows,
                          longest_cutover_s=moved.cutover_s, version=moved.version)  # fmt: skip
            self.live = sorted(ranks)
            if count < before:
                time.sleep(DRAIN_LINGER_S)
                self._stop_servers(peers, removed)
                report["stopped"] = removed
        finally:
            peers.close()
        report["seconds"] = time.perf_counter() - start
        report["endpoints"] = [self.endpoints[r] for r in self.live]
        return report

    def _start_servers(self, count: int) -> list[int]:
        ranks = list(range(len(self.endpoints), len(self.endpoints) + count))
        launch = self.launch_servers or self._launch_local
        started = launch(ranks, list(self.endpoints))
        self.endpoints = [*self.endpoints, *(s.endpoint for s in started)]
        deadline = time.monotonic() + SERVER_READY_S
        peers = self._peers()
        try:
            for rank, server in zip(ranks, started, strict=True):
                while True:
                    exited = server.exited()
                    if exited is not None:
                        raise ScaleError(f"scale: new server {rank} {exited} while starting")
                    try:
                        peers.call(server.endpoint, "ping", timeout=1.0)
                        break
                    except SparsePSError:
                        if time.monotonic() > deadline:
                            raise ScaleError(
                                f"scale: new server {rank} at {server.endpoint} did not answer "
                                f"within {SERVER_READY_S:g} s; see {server.log_path}"
                            ) from None
                        time.sleep(0.1)
        finally:
            peers.close()
        return ranks

    def _launch_local(self, ranks: list[int], endpoints: list[str]) -> list[NewServer]:
        """New server processes of a one-node launch, on free ports of ``host``."""
        from .spec import free_ports

        if self.new_server is None:
            raise ScaleError("scale --servers: this launcher cannot start servers")
        grown = [*endpoints, *(f"{self.host}:{p}" for p in free_ports(self.host, len(ranks)))]
        started = []
        for rank in ranks:
            child = self.supervisor.add_child(self.new_server(rank, grown))

            def exited(proc=child.proc, log_path=child.spec.log_path) -> str | None:
                if proc.poll() is None:
                    return None
                return f"(pid {proc.pid}) exited with code {proc.returncode}; see {log_path}"

            started.append(NewServer(grown[rank], exited, str(child.spec.log_path)))
        return started

    def _placement(self, peers: Peers) -> Placement:
        """The servers' placement; on the first scale, today's routing installed as one."""
        from ..core.placement import Placement
        from ..elastic import install_placement

        current = peers.newest([self.endpoints[r] for r in self.live])  # not the stopped
        if current is None:
            current = Placement.default(self.endpoints[: self.start_servers])
            install_placement(peers, current)
        return current

    def _check_dense(self, peers: Peers, removed: list[int]) -> None:
        for rank in removed:
            stats = peers.call(self.endpoints[rank], "stats")[0]
            if stats.get("dense"):
                raise ScaleError(
                    f"scale: server {rank} at {self.endpoints[rank]} holds dense table(s) "
                    f"{sorted(stats['dense'])} (dense tables stay on the server "
                    f"dense_server_of(name, {self.start_servers}) of the start count); keep at "
                    f"least {rank + 1} servers, or move the dense part to the workers"
                )

    def _stop_servers(self, peers: Peers, ranks: list[int]) -> None:
        for rank in ranks:
            self.supervisor.retire(Role.SERVER, rank)
            try:
                peers.call(self.endpoints[rank], "stop", timeout=10.0)
            except SparsePSError as exc:  # the supervisor's SIGTERM below still stops it
                log.warning("scale: stop request to server %d failed: %s", rank, exc)
        self.supervisor.wait_retired(timeout=15.0)


class ScaleService(Closing):
    """Serves ``sparseps scale`` requests from the control store (module docstring).

    Args:
        scaler: does the work.
        host: where the control store listens (the launcher's host).
        security: the job's CURVE keys (None: plain).
        workers: the launch's worker count (the world before any ``--workers``).
    """

    def __init__(self, scaler: JobScaler, host: str, *, security=None, workers: int) -> None:
        self.scaler = scaler
        self.world = workers
        self._server = StoreServer(host, 0, security=security)
        self.address = self._server.address
        self._store = StoreClient(self.address, timeout_s=10.0, setting="-", what="control store",
                               security=security)  # fmt: skip
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a scale request and a worker's death, one at a time
        from .supervisor import Supervisor

        if isinstance(scaler.supervisor, Supervisor):  # a dead worker of an online job leaves
            scaler.supervisor.worker_left = self.worker_died
        self._thread = threading.Thread(target=self._run, name="sparseps-scale", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                if not self._store.check(["scale/request"]):
                    continue
                raw = self._store.get("scale/request")
                self._store.delete_key("scale/request")
                request = json.loads(raw)
            except SparsePSError as exc:  # the store is in this process: only at close
                log.debug("control store: %s", exc)
                continue
            except ValueError:
                request = None
            if not isinstance(request, dict) or not isinstance(request.get("id"), str):
                log.warning("control store: a malformed scale request was dropped")
                continue
            with self._lock:
                result = self._gated(request)
            try:
                self._store.set(f"scale/result/{request.get('id')}", json.dumps(result).encode())
                self._store.set("scale/busy", b"0")
            except SparsePSError as exc:
                log.warning("control store: %s", exc)

    def _gated(self, request: dict) -> dict:
        """Serve ``request`` unless the job is finishing; the job does not complete while
        it is served (``begin_change``/``end_change`` of the local launcher's supervisor
        or, under Ray, of the driver's job through its roles)."""
        supervisor = self.scaler.supervisor
        if supervisor is None:  # a scaler without a launcher (tests)
            return self._serve(request)
        why = supervisor.begin_change()
        if why:
            log.error("scale refused: %s", why)
            return {"ok": False, "error": f"scale: {why}"}
        try:
            return self._serve(request)
        finally:
            supervisor.end_change()

    def _serve(self, request: dict) -> dict:
        out: dict = {"ok": True}
        try:
            servers, workers = request.get("servers"), request.get("workers")
            if workers is not None:  # checked first: it may refuse without changing anything
                out.update(self.scaler.worker_scaling.workers(int(workers), self.world))
                self.world = int(workers)
            if servers is not None:
                log.info("scale: servers %d -> %d", len(self.scaler.live), int(servers))
                out.update(self.scaler.servers(int(servers)))
                log.info("scale: %s", out)
        except SparsePSError as exc:
            log.error("scale failed: %s", exc)
            return {"ok": False, "error": str(exc), **{k: v for k, v in out.items() if k != "ok"}}
        except Exception as exc:  # never kill the launcher; the CLI shows it
            log.exception("scale failed")
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return out

    def worker_died(self, rank: int, code: int) -> str | None:  # noqa: ARG002 - the supervisor's hook
        """The supervisor's ``worker_left``: record a dead worker's leave (or say why not)."""
        with self._lock:
            why = self.scaler.worker_scaling.worker_died(rank, self.world)
            if not why:
                self.world -= 1
            return why

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._store.close()
        self._server.close()
