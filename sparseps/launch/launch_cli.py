"""``sparseps launch``: start servers and workers running one script, like ``fleetrun``.

Every process runs the same user script; the script reads its role with ``sps.init()``
and calls ``sps.run_server()`` when it is a server. See docs/launch.md.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..env import MASTER, Role, child_environ
from ..errors import ConfigError, SparsePSError
from .config import LaunchConfig
from .heter_devices import heter_device_env
from .logsetup import LauncherLog
from .records import Outcome

__all__ = ["BACKENDS", "Backend", "LocalBackend", "add_arguments", "backend_of", "launch", "run"]

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``launch`` options (fleetrun's underscore spellings are accepted too)."""
    add = parser.add_argument
    add("--server-num", "--server_num", dest="server_num", type=int, default=None,
        help="number of servers (default 1, or the length of --servers)")  # fmt: skip
    add("--worker-num", "--worker_num", "--trainer-num", "--trainer_num", dest="worker_num",
        type=int, default=None, help="number of workers (default 1, or the length of --workers)")  # fmt: skip
    add("--log-dir", "--log_dir", dest="log_dir", default="log",
        help="folder of server.R.log / worker.R.log / pids.json (default ./log)")  # fmt: skip
    add("--host", default=None,
        help="this node's address; it runs the --servers/--workers entries on this host")  # fmt: skip
    add("--servers", default=None, help="host:port,... of every server of the job (multi-node)")
    add("--workers", default=None, help="host,... of every worker of the job (multi-node)")
    add("--master", default=None,
        help="host:port of the workers' rendezvous (default: a free port on one node; "
             "worker 0's host and port 6170 across nodes)")  # fmt: skip
    add("--job-id", dest="job_id", default=None, help="id shared by every process of the job")
    add("--secure", action=argparse.BooleanOptionalAction, default=None,
        help="authenticated, encrypted transport (CURVE) on every socket of the job; default: "
             "on when a host is not a loopback address (docs/security.md)")  # fmt: skip
    add("--key-dir", dest="key_dir", default=None,
        help="the job's key folder from `sparseps keys DIR` (implies --secure; required when a "
             "secure job spans hosts; default on one node: fresh keys in LOG_DIR/keys)")  # fmt: skip
    add("--file-root", dest="file_roots", action="append", default=None, metavar="DIR",
        help="a folder the servers' save/load may use (repeatable); paths outside every root "
             "are refused (default: any path; docs/security.md)")  # fmt: skip
    add("--replicas", type=int, default=0, metavar="R",
        help="keep R backup copies of every shard on the next servers: a lost server is "
             "routed around and the job goes on (default 0; docs/replication.md)")  # fmt: skip
    add("--heter-worker-num", "--heter_worker_num", dest="heter_worker_num", type=int,
        default=None, metavar="H",
        help="heter workers: the dense network runs on them, embeddings and IO on the "
             "workers (default none; docs/heterps.md)")  # fmt: skip
    add("--heter-workers", dest="heter_workers", default=None,
        help="host:port,... of every heter worker (multi-node)")  # fmt: skip
    add("--heter-device", dest="heter_device", default=None,
        help="where heter workers run the dense network: cpu (default), cuda, auto, or one "
             "per heter worker, e.g. cuda,cpu (docs/heterps.md)")  # fmt: skip
    add("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0,
        help="restart a failed worker group up to N times, and each heter worker (default 0)")  # fmt: skip
    add("--grace-s", dest="grace_s", type=float, default=5.0,
        help="seconds between SIGTERM and SIGKILL when stopping processes (default 5)")  # fmt: skip
    add("--quiet-warn-s", dest="quiet_warn_s", type=float, default=300.0,
        help="warn when a process writes nothing for this long (default 300)")  # fmt: skip
    add("--rendezvous-timeout-s", dest="rendezvous_timeout_s", type=float, default=300.0,
        help="multi-node: how long launchers wait for each other (default 300)")  # fmt: skip
    add("--metrics", action=argparse.BooleanOptionalAction, default=None,
        help="every role and the launcher serve Prometheus /metrics on free ports listed in "
             "pids.json (default on, off in a --secure job: plain HTTP; --no-metrics turns "
             "it off; docs/observability.md)")  # fmt: skip
    add("--status-port", dest="status_port", type=int, default=None, metavar="P",
        help="serve the job's status page on this port of --host (0: a free port; default: "
             "no page)")  # fmt: skip
    add("--backend", choices=["local", "ray"], default="local",
        help="local: start the processes here (default); ray: Ray places and starts them "
             "on its cluster (docs/cluster.md; extra: sparseps[ray])")  # fmt: skip
    add("--address", default=None,
        help="--backend ray: the Ray cluster's address (default: RAY_ADDRESS, a running "
             "local cluster, or a new one)")  # fmt: skip
    add("--server-resources", dest="server_resources", default=None, metavar="JSON",
        help='--backend ray: each server\'s Ray resources, e.g. \'{"CPU": 2, "memory": 4e9}\' '
             '(default {"CPU": 1})')  # fmt: skip
    add("--worker-resources", dest="worker_resources", default=None, metavar="JSON",
        help='--backend ray: each worker\'s Ray resources, e.g. \'{"CPU": 4, "GPU": 1}\' '
             '(default {"CPU": 1})')  # fmt: skip
    add("--heter-resources", dest="heter_resources", default=None, metavar="JSON",
        help="--backend ray: each heter worker's Ray resources (default {\"CPU\": 1}, plus "
             "{\"GPU\": 1} where the cluster has a GPU for each)")  # fmt: skip
    add("script", help="the Python script every server and worker runs")
    add("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def _children(
    spec, script: str, script_args: list[str], extra: dict[str, str], *, metrics: bool
) -> list:
    """This node's processes. Each runs the script through :mod:`sparseps.observe.child`
    (stack dumps on SIGUSR1; ``/metrics`` on a free port when ``metrics``)."""
    from .spec import free_ports

    children = []
    local = [
        (Role.SERVER, spec.local_servers()),
        (Role.HETER_WORKER, spec.local_heter_workers()),
        (Role.WORKER, spec.local_workers()),
    ]
    count = sum(len(ranks) for _, ranks in local)
    ports = iter(free_ports(spec.host, count) if metrics else [None] * count)
    for role, ranks in local:
        for rank in ranks:
            children.append(_child(spec, role, rank, script, script_args, extra, next(ports)))
    return children


def _child(spec, role: Role, rank: int, script: str, script_args: list[str],
           extra: dict[str, str], port: int | None):  # fmt: skip
    """One process of the job: ``role`` ``rank`` of ``spec`` (its §2.2 environment)."""
    from .supervisor import ChildSpec

    observe = ("--metrics-port", str(port), "--metrics-host", spec.host) if port else ()
    argv = (
        sys.executable, "-u", "-m", "sparseps.observe.child", *observe, script, *script_args,
    )  # fmt: skip
    extra = heter_device_env(extra, role, rank, len(spec.heter_workers))
    env = child_environ(
        {**spec.role_env(role, rank).to_environ(), "PYTHONUNBUFFERED": "1", **extra}
    )
    from .fork_server import script_imports_torch

    return ChildSpec(
        role=role,
        rank=rank,
        argv=argv,
        env=env,
        log_path=Path(spec.log_dir) / f"{role.value}.{rank}.log",
        echo=role is Role.WORKER and rank == 0,
        metrics_port=port,
        script_imports_torch=script_imports_torch(os.path.abspath(script)),
    )


def _scaler(args: LaunchConfig, spec, script: Path, supervisor, security):
    """What serves ``sparseps scale`` on this one-node launch (:mod:`.scaling`)."""
    from dataclasses import replace

    from .scaling import JobScaler
    from .spec import free_ports

    def port() -> int | None:
        return free_ports(spec.host, 1)[0] if args.metrics else None

    def new_server(rank: int, endpoints: list[str]):
        grown = replace(spec, servers=tuple(endpoints))
        return _child(grown, Role.SERVER, rank, str(script), list(args.script_args),
                      args.child_settings(), port())  # fmt: skip

    def new_worker(rank: int, world: int):
        hosts = spec.workers + (spec.host,) * max(0, world - len(spec.workers))
        child = _child(replace(spec, workers=hosts), Role.WORKER, rank, str(script),
                       list(args.script_args), args.child_settings(), port())  # fmt: skip
        return replace(child, env={**child.env, MASTER: master()}, echo=False)

    def master() -> str:  # the rendezvous of the running generation
        return supervisor.worker_env().get(MASTER, spec.master)

    return JobScaler(
        supervisor=supervisor, endpoints=list(spec.servers), new_server=new_server,
        new_worker=new_worker, host=spec.host, job_id=spec.job_id, security=security,
        replicas=args.replicas, master=master,
    )  # fmt: skip


def _server_stopper(
    endpoints: tuple[str, ...] | Callable[[], list[str]],
    ranks: list[int] | Callable[[], list[int]],
    timeout_s: float,
    job_id: str,
    security=None,
    lost: Callable[[], set[int]] = set,
):
    """Ask this node's servers (``ranks`` of the job's ``endpoints``, less the ``lost()``
    ones of a replicated job) to stop. ``endpoints`` and ``ranks`` may be callables (a
    scaled job: its servers now)."""

    def stop() -> None:
        from ..rpc.stop import stop_servers  # the wire alone: no table code, no numba

        now = ranks() if callable(ranks) else ranks
        listed = endpoints() if callable(endpoints) else endpoints
        live = [rank for rank in now if rank not in lost()]
        stop_servers(list(listed), live, timeout=timeout_s, job_id=job_id, security=security)

    return stop


def _fresh_master(host: str):
    """Restart generation k of a one-node job meets at a new free port: a fresh rendezvous
    (nothing of the old store or gloo group can be met again)."""

    def env(generation: int) -> dict[str, str]:  # noqa: ARG001 - same rule for every k
        from .spec import free_ports

        return {MASTER: f"{host}:{free_ports(host, 1)[0]}"}

    return env


def run(args: argparse.Namespace) -> int:
    """``sparseps launch``: the job of the command line (the exit code says how it ended)."""
    return launch(LaunchConfig.from_args(args)).exit_code


@runtime_checkable
class Backend(Protocol):
    """Where a :class:`LaunchConfig`'s job runs: ``launch`` runs it (or, for Kubernetes,
    writes what runs it) and says how it ended."""

    name: str

    def launch(self, config: LaunchConfig) -> Outcome: ...


class LocalBackend:
    """``local``: this node's share of the job started and supervised by this process."""

    name = "local"

    def launch(self, config: LaunchConfig) -> Outcome:
        return _launch_here(config)


# config.backend -> "module:class" of its Backend (imported when chosen: Ray and the YAML
# writer stay out of a local launch)
BACKENDS: dict[str, str] = {
    "local": "sparseps.launch.launch_cli:LocalBackend",
    "ray": "sparseps.launch.ray_backend:RayBackend",
    "kubernetes": "sparseps.launch.k8s:KubernetesBackend",
}


def backend_of(name: str) -> Backend:
    """The :class:`Backend` named ``name`` (``LaunchConfig.backend``)."""
    try:
        module, cls = BACKENDS[name].split(":")
    except KeyError:
        raise ConfigError(
            f"--backend: expected one of {', '.join(BACKENDS)}, got {name!r}"
        ) from None
    backend = getattr(importlib.import_module(module), cls)()
    if not isinstance(backend, Backend):
        raise TypeError(f"BACKENDS[{name!r}]: {module}.{cls} is no Backend (name, launch)")
    return backend


def launch(config: LaunchConfig) -> Outcome:
    """Run the job of ``config`` on its backend (:data:`BACKENDS`): this node's share of it
    here (``local``: started and supervised by this process), placed by Ray (``ray``), or
    written as Kubernetes objects (``kubernetes``)."""
    return backend_of(config.backend).launch(config)


def _launch_here(args: LaunchConfig) -> Outcome:
    from .spec import make_spec

    script = Path(args.script)
    if not script.is_file():
        raise ConfigError(f"launch: script {args.script!r} not found (cwd {os.getcwd()})")
    spec = make_spec(
        server_num=args.server_num,
        worker_num=args.worker_num,
        servers=args.servers,
        workers=args.workers,
        host=args.host,
        master=args.master,
        log_dir=args.log_dir,
        job_id=args.job_id,
        secure=args.secure,
        key_dir=args.key_dir,
        heter_worker_num=args.heter_worker_num,
        heter_workers=args.heter_workers,
    )
    args = _plain_http(args, secure=spec.secure)
    from ..core.replicas import check_replicas

    check_replicas(args.replicas, len(spec.servers), where="--replicas")
    Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
    security = _job_security(spec, made_here=spec.secure and not args.key_dir)
    out = LauncherLog(Path(spec.log_dir) / "launcher.log")
    try:
        out.say(spec.describe(), sys.stdout)
        outcome = _supervise(args, spec, script, security)
        if outcome.failure is not None:
            out.say(
                f"sparseps launch: job {spec.job_id} failed: {outcome.failure.describe()}",
                sys.stderr,
            )
        elif outcome.reason == "interrupted":
            out.say(
                f"sparseps launch: job {spec.job_id} interrupted; every process stopped",
                sys.stderr,
            )
        else:
            out.say(f"sparseps launch: job {spec.job_id} completed", sys.stdout)
        return outcome
    except SparsePSError as exc:  # e.g. the control store; main() prints it on the console
        out.say(f"sparseps launch: error: {exc}")
        raise
    finally:
        out.close()


def _plain_http(args: LaunchConfig, *, secure: bool) -> LaunchConfig:
    """``/metrics`` and the status page are plain HTTP, which CURVE cannot cover: a secure
    job serves neither (``--secure`` covers every socket of a job, docs/security.md), and
    asking for one refuses the launch, saying why."""
    if not secure:
        return args.replace(metrics=args.metrics is not False)
    asked = "--metrics" if args.metrics else "--status-port" if args.status_port is not None else ""
    if asked:
        raise ConfigError(
            f"{asked}: serves plain HTTP, which --secure cannot cover (every socket of a secure "
            f"job admits only holders of the job's key); drop {asked}, or run the job with "
            "--no-secure on a trusted network (docs/security.md)"
        )
    return args.replace(metrics=False)


def _job_security(spec, *, made_here: bool):
    """The job's :class:`~sparseps.rpc.security.Security` (None: plain transport).

    A one-node secure job without ``--key-dir`` gets fresh keys in ``LOG_DIR/keys``
    (replacing any of an earlier job there: its leftovers must not reach this one). Keys
    are loaded here, before any child starts, so a bad folder fails the launch at once.
    """
    if not spec.secure:
        return None
    from ..rpc.security import JobKeys, Security, write_job_keys

    if made_here:
        write_job_keys(spec.key_dir, force=True)
    return Security(JobKeys.load(spec.key_dir))


def _supervise(args: LaunchConfig, spec, script: Path, security=None) -> Outcome:
    from .node_sync import StoreCoordinator
    from .supervisor import Supervisor, SupervisorConfig

    config = SupervisorConfig(
        max_restarts=args.max_restarts,
        grace_s=args.grace_s,
        quiet_warn_s=args.quiet_warn_s,
        replicas=args.replicas,
        server_num=len(spec.servers),
    )
    coordinator = None
    if spec.multi_node:
        coordinator = StoreCoordinator(
            spec.control_endpoint,
            host_it=spec.is_control_host,
            node=spec.host,
            peers=spec.nodes,
            job_id=spec.job_id,
            worker_num=len(spec.workers),
            timeout_s=args.rendezvous_timeout_s,
            worker_nodes=tuple(dict.fromkeys(spec.workers)),
            security=security,
        )
    local_servers = spec.local_servers()
    children = _children(
        spec, str(script), list(args.script_args), args.child_settings(), metrics=bool(args.metrics)
    )
    extra_record: dict[str, object] = {}  # written to pids.json once run() starts
    scaler = None
    supervisor = Supervisor(
        children=children,
        config=config,
        coordinator=coordinator,
        stop_servers=_server_stopper(
            lambda: spec.servers if scaler is None else scaler.endpoints,
            lambda: local_servers if scaler is None else scaler.live,
            config.server_stop_s,
            spec.job_id,
            security,
            lost=lambda: supervisor.lost_servers,
        )
        if local_servers
        else None,
        pids_path=Path(spec.log_dir) / "pids.json",
        job_id=spec.job_id,
        node=spec.host,
        # Across nodes the master port is the user's (firewalls); every launcher stops its
        # workers before any restarts, so worker 0 binds it again (node_sync.py).
        restart_env=None if spec.multi_node else _fresh_master(spec.host),
        extra_record=extra_record,
    )
    service = None
    if not spec.multi_node:  # `sparseps scale` serves one-node launches
        from .scaling import ScaleService

        scaler = _scaler(args, spec, script, supervisor, security)
        service = ScaleService(scaler, spec.host, security=security, workers=len(spec.workers))
        extra_record["control"] = service.address
        if spec.key_dir:
            extra_record["key_dir"] = spec.key_dir
    try:
        return _run_observed(args, spec, supervisor, extra_record)
    finally:
        if service is not None:
            service.close()


def _run_observed(args: LaunchConfig, spec, supervisor, extra_record: dict) -> Outcome:
    """Run the supervisor with the launcher's ``/metrics`` and status page (when asked);
    their ports go to ``pids.json``."""
    from ..observe.registry import serve_metrics, stop_serving_metrics
    from ..observe.status import StatusServer
    from .spec import free_ports

    status = None
    try:
        if args.metrics:
            port = serve_metrics(free_ports(spec.host, 1)[0], spec.host)
            extra_record["launcher_metrics_port"] = port
        if args.status_port is not None:
            try:
                status = StatusServer(
                    supervisor.roles, job_id=spec.job_id, host=spec.host,
                    port=args.status_port, metrics_host=spec.host,
                )  # fmt: skip
            except OSError as exc:
                raise ConfigError(
                    f"--status-port {args.status_port}: cannot serve on {spec.host} ({exc}); "
                    "pick another port, or 0 for a free one"
                ) from None
            extra_record["status_port"] = status.port
            log.info("status page: http://%s:%d/", spec.host, status.port)
            status.start()
        return supervisor.run()
    finally:
        if status is not None:
            status.close()
        if args.metrics:
            stop_serving_metrics()
