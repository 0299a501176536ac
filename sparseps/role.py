"""The role API: what a user script asks to find its place in a job (DESIGN §2.3).

One script runs on every process of a job (fleetrun semantics)::

    import sparseps as sps
    sps.init()
    if sps.is_server():
        sps.run_server()          # blocks until the launcher stops the job
    else:
        ...                       # train with sps.worker_index() of sps.worker_num()
        sps.barrier_worker()
        sps.stop()

On a worker, :func:`init` also sets up ``torch.distributed`` among the workers (gloo; in
a ``--secure`` job a group over the job's CURVE transport,
:mod:`sparseps.runtime.curve_group`), meeting at ``SPARSEPS_MASTER`` where worker 0 hosts
the rendezvous store. A script run with plain
``python script.py`` (no SPARSEPS_* variable) runs in local mode: one background server
is started for it, and it is worker 0 of 1.

The role is process-wide state, like ``torch.distributed``'s default group: a process
has exactly one role in one job. It is created by :func:`init`, never at import time,
and torn down by :func:`stop` (or at exit).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import env as _env
from .core import worker_store
from .core.validate import check_float
from .env import Role, RoleEnv
from .errors import ConfigError, SparsePSError

if TYPE_CHECKING:
    from torch.distributed import Store

    from .runtime.local import LocalServer
    from .runtime.worker_group import WorkerGroup

__all__ = [
    "barrier_worker",
    "init",
    "is_heter_worker",
    "is_server",
    "is_worker",
    "role_env",
    "run_server",
    "server_endpoints",
    "server_num",
    "stop",
    "worker_index",
    "worker_num",
]

log = logging.getLogger(__name__)


@dataclass
class _Session:
    env: RoleEnv
    store: Store | None = None  # workers only
    local_server: LocalServer | None = None  # in local mode
    barriers: int = 0
    group: WorkerGroup | None = None  # the workers' torch.distributed group (workers only)


_lock = threading.Lock()
_session: _Session | None = None
_atexit_registered = False


def init(*, environ: Mapping[str, str] | None = None) -> RoleEnv:
    """Find this process's role and connect it to the job; idempotent.

    With no logging configured by the application (no handler on the root or the
    ``sparseps`` logger), sparseps's INFO lines go to stderr (see
    :mod:`sparseps.launch.logsetup`).

    Args:
        environ: the variables to read instead of ``os.environ`` (tests).

    Returns:
        the role of this process.

    Raises:
        ConfigError: some SPARSEPS_* variables are set but one is missing or malformed
            (names it); there is no fallback from a half-configured cluster to local mode.
        DeadlineError: a worker could not meet the others within
            ``SPARSEPS_RENDEZVOUS_TIMEOUT_S`` (names the missing ranks).
        UnavailableError: local mode's server did not start.
    """
    global _session, _atexit_registered
    from .launch.logsetup import ensure_default_logging

    with _lock:
        if _session is not None:
            return _session.env
        # before anything logs: with no logging configured, INFO lines (local mode,
        # training progress) would otherwise never be seen
        ensure_default_logging()
        found = _env.from_environ(environ)
        session = _init_local(environ) if found is None else _Session(found)
        try:
            if session.env.role is Role.WORKER and session.store is None:
                _join_workers(session, environ)
        except BaseException:
            _teardown(session, wait_for_peers=False)
            raise
        _session = session
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
        env = session.env
        log.info(
            "sparseps %s %d of %d (job %s, servers %s%s)",
            env.role.value,
            env.rank,
            {Role.WORKER: env.worker_num, Role.HETER_WORKER: len(env.heter_workers)}.get(
                env.role, len(env.servers)
            ),
            env.job_id,
            ",".join(env.servers),
            f", restart {env.restart_count}" if env.restart_count else "",
        )
        return env


def _init_local(environ: Mapping[str, str] | None) -> _Session:
    import os

    import torch.distributed as dist

    from .runtime.local import LocalServer
    from .runtime.worker_group import WorkerGroup

    server = LocalServer(start_timeout_s=_env.settings(environ).server_start_timeout_s)
    endpoint = server.start()
    env = RoleEnv(
        role=Role.WORKER,
        rank=0,
        servers=(endpoint,),
        worker_num=1,
        master="",
        log_dir=str(server.log_dir),
        job_id=f"local-{os.getpid()}",
        local=True,
    )
    group = WorkerGroup(timeout_s=_env.settings(environ).collective_timeout_s, env=env)
    session = _Session(env, store=dist.HashStore(), local_server=server, group=group)
    try:
        group.form(session.store, rank=0, world=1, prefix="sparseps/group")
    except BaseException:
        server.close()
        raise
    return session


def _join_workers(session: _Session, environ: Mapping[str, str] | None) -> None:
    from .runtime.rendezvous import connect_store, store_barrier
    from .runtime.worker_group import WorkerGroup

    env = session.env
    settings = _env.settings(environ)
    timeout_s = settings.rendezvous_timeout_s
    session.store = connect_store(env, timeout_s=timeout_s, setting=_env.RENDEZVOUS_TIMEOUT)
    # work-stealing datasets claim files on it (sparseps.data.steal, with several workers)
    # and an online job's membership lives on it: also with one worker, whose job may grow
    worker_store.register(session.store)
    # A barrier of our own before the group's: if a worker never comes, it is named.
    store_barrier(
        session.store,
        "sparseps/rendezvous",
        rank=env.rank,
        world=env.worker_num,
        timeout_s=timeout_s,
        warn_s=settings.barrier_warn_s,
        address=env.master,
        op="rendezvous",
        setting=_env.RENDEZVOUS_TIMEOUT,
    )
    session.group = WorkerGroup(timeout_s=settings.collective_timeout_s, env=env)
    if not session.group.form(
        session.store, rank=env.rank, world=env.worker_num, prefix="sparseps/group"
    ):
        log.warning("torch.distributed is already initialised; sparseps uses that group")


def _current() -> _Session:
    session = _session
    if session is None:
        raise ConfigError(
            "sparseps role: call sps.init() first (it reads the SPARSEPS_* variables)"
        )
    return session


def role_env() -> RoleEnv | None:
    """The role set by :func:`init`, or None before it (and after :func:`stop`)."""
    session = _session
    return None if session is None else session.env


def is_server() -> bool:
    return _current().env.role is Role.SERVER


def is_worker() -> bool:
    return _current().env.role is Role.WORKER


def is_heter_worker() -> bool:
    """A heter worker (``sparseps launch --heter-worker-num``): its Trainer serves the
    dense network (docs/heterps.md); scripts need not branch on it."""
    return _current().env.role is Role.HETER_WORKER


def worker_index() -> int:
    """This worker's rank (``0..worker_num()-1``); a ConfigError on a server."""
    env = _current().env
    if env.role is not Role.WORKER:
        raise ConfigError(
            f"worker_index(): this process is {env.role.value} {env.rank}, not a worker"
        )
    return env.rank


def worker_num() -> int:
    return _current().env.worker_num


def server_num() -> int:
    return len(_current().env.servers)


def server_endpoints() -> list[str]:
    """``host:port`` of every server; index = server rank."""
    return list(_current().env.servers)


def run_server() -> None:
    """Serve this process's shard until the job stops it (a stop request or SIGTERM).

    Raises:
        ConfigError: this process is not a server.
    """
    env = _current().env
    if env.role is not Role.SERVER:
        raise ConfigError(
            f"run_server(): this process is worker {env.rank}; guard it with "
            f"`if sps.is_server(): sps.run_server()`"
        )
    from .server import run_from_env

    run_from_env(env)


def barrier_worker(timeout: float | None = None) -> None:
    """Wait until every worker has called its barrier of the same number.

    Logs (WARNING) the workers still missing every ``SPARSEPS_BARRIER_WARN_S`` seconds.

    Args:
        timeout: seconds; default ``SPARSEPS_BARRIER_TIMEOUT_S`` (1800).

    Raises:
        DeadlineError: with ``op="barrier"`` and ``rank`` = the missing worker ranks.
        ConfigError: called on a server.
    """
    session = _current()
    env = session.env
    if env.role is not Role.WORKER:
        raise ConfigError("barrier_worker(): only workers take part in worker barriers")
    if timeout is not None:
        check_float("barrier_worker", "timeout", timeout, gt=0)
    from .runtime.rendezvous import store_barrier

    session.barriers += 1
    store_barrier(
        session.store,
        f"sparseps/barrier/{session.barriers}",
        rank=env.rank,
        world=env.worker_num,
        timeout_s=timeout or _env.settings().barrier_timeout_s,
        warn_s=_env.settings().barrier_warn_s,
        address=env.master or "local",
        setting="barrier_worker(timeout=)" if timeout else _env.BARRIER_TIMEOUT,
    )


def stop() -> None:
    """Leave the job: tear down the workers' process group and, in local mode, the server.

    Worker 0 hosts the rendezvous store, so it waits (bounded by
    ``SPARSEPS_BARRIER_TIMEOUT_S``) until every worker has called ``stop()`` before
    closing it. Servers of a launched job are stopped by the launcher once every worker
    has exited, not here. Idempotent; also runs at exit (without that wait).
    """
    _shutdown(wait_for_peers=True)


def _at_exit() -> None:
    _shutdown(wait_for_peers=False)


def _shutdown(*, wait_for_peers: bool) -> None:
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        _teardown(session, wait_for_peers=wait_for_peers)


def _teardown(session: _Session, *, wait_for_peers: bool) -> None:
    env = session.env
    try:
        if wait_for_peers and env.role is Role.WORKER and env.worker_num > 1 and session.store:
            _exit_barrier(session, session.store)
        if session.group is not None and session.group.owned:
            session.group.leave()
    finally:
        worker_store.register(None)
        session.store = None  # worker 0: closes the store's server
        if session.local_server is not None:
            session.local_server.close()


def _exit_barrier(session: _Session, store: Store) -> None:
    from .runtime.rendezvous import store_barrier

    env = session.env
    try:
        if env.rank != 0:
            store.set(f"sparseps/exit/{env.rank}", "1")
            return
        store_barrier(
            store,
            "sparseps/exit",
            rank=0,
            world=env.worker_num,
            timeout_s=_env.settings().barrier_timeout_s,
            warn_s=_env.settings().barrier_warn_s,
            address=env.master,
            op="stop",
            setting=_env.BARRIER_TIMEOUT,
        )
    except SparsePSError as exc:  # leaving anyway: the launcher handles failed peers
        log.warning("stop(): %s", exc)
    except Exception as exc:  # torch store errors (worker 0 already gone)
        log.warning("stop(): could not reach the rendezvous store at %s: %s", env.master, exc)
