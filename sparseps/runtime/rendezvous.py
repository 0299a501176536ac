"""Where workers meet: worker 0's rendezvous store and barriers on it.

The workers of a job find each other at ``SPARSEPS_MASTER``: worker 0 hosts a
:class:`~sparseps.store.server.StoreServer` there, bound to the master's host address
only (CURVE-secured when the job is), and every worker, worker 0 included, talks to it
through a :class:`~sparseps.store.torch_store.ZmqStore`. On top of the store:

- :func:`store_barrier` — every rank sets ``NAME/<rank>``, then polls until all keys
  exist. Unlike ``dist.barrier()`` it can say *which* ranks are missing: it logs them
  every ``warn_s`` and raises :class:`~sparseps.errors.DeadlineError` naming them.
- :func:`worker_backend` — the backend of the workers' ``torch.distributed`` group
  (:class:`~sparseps.runtime.worker_group.WorkerGroup`: metrics all-reduce, dense
  all-reduce in sync mode, GPUPS rows, the global shuffle), formed on the same store after
  a rendezvous barrier, so a missing worker is named instead of a bare torch timeout:
  gloo, or in a secure job :mod:`sparseps.runtime.curve_group` (gloo's TCP pairs can be
  neither encrypted nor authenticated; ``--secure`` covers every socket of the job).
"""

from __future__ import annotations

import logging
import socket
import time

from ..env import MASTER, RoleEnv, from_environ, parse_endpoint, security_setting
from ..errors import ConfigError, DeadlineError, UnavailableError
from ..rpc.security import JobKeys, Security
from ..store.client import open_store
from ..store.server import resolve_host
from ..store.torch_store import ZmqStore

__all__ = [
    "connect_store",
    "group_options",
    "listen_host",
    "store_barrier",
    "worker_backend",
]

log = logging.getLogger(__name__)


def connect_store(env: RoleEnv, *, timeout_s: float, setting: str, security=None) -> ZmqStore:
    """Host (worker 0) or join (others) the job's rendezvous store at ``env.master``.

    Worker 0 listens on the master's host address only (not every interface). The store is
    CURVE-secured when the job is (``env.key_dir``), or with an explicit ``security``.

    Raises:
        UnavailableError: worker 0 cannot listen on the master port; a CURVE handshake
            failed (this process lacks the job key).
        DeadlineError: worker 0's store did not answer within ``timeout_s``.
        ConfigError: the job's key folder is unreadable or malformed.
    """
    host, port = parse_endpoint(env.master, what=MASTER)
    if security is None and env.key_dir:
        security = Security(JobKeys.load(env.key_dir))
    return open_store(
        env.master,
        serve=(host, port) if env.rank == 0 else None,
        timeout_s=timeout_s,
        setting=setting,
        what="rendezvous store",
        security=security,
        cannot_listen=lambda exc: UnavailableError(
            f"rendezvous: worker 0 cannot listen on {env.master} ({exc}); is the port "
            f"free on this host? ({MASTER})",
            op="rendezvous",
            role="worker",
            rank=0,
            address=env.master,
        ),
        no_answer=lambda exc: DeadlineError(
            f"rendezvous: worker 0's store at {env.master} did not answer within "
            f"{timeout_s:.0f} s ({exc}); check worker 0's log, or raise {setting}",
            op="rendezvous",
            role="worker",
            rank=0,
            address=env.master,
            seconds=timeout_s,
            setting=setting,
        ),
        client=ZmqStore,
    )


def store_barrier(
    store,
    name: str,
    *,
    rank: int,
    world: int,
    timeout_s: float,
    warn_s: float,
    address: str,
    op: str = "barrier",
    setting: str = "",
) -> None:
    """Wait until every rank in ``0..world-1`` has reached barrier ``name``.

    Args:
        store: a ``torch.distributed.Store`` shared by the ranks.
        name: unique per barrier instance (e.g. ``sparseps/barrier/3``).
        rank, world: this worker and the number of workers.
        timeout_s: give up after this long.
        warn_s: log the missing ranks every ``warn_s`` seconds.
        address: the store's endpoint, for messages.
        op, setting: named in the timeout error (what waited, what changes the limit).

    Raises:
        DeadlineError: some ranks did not arrive; ``rank`` holds their list. In a
            launched job the stacks of every role are dumped first and the message names
            the folder (:func:`sparseps.observe.diagnose.auto_diagnose`).
        UnavailableError: the store went away (worker 0 exited).
    """
    keys = [f"{name}/{r}" for r in range(world)]
    start = time.monotonic()
    next_warn = start + warn_s
    pause = 0.001
    try:
        store.set(keys[rank], "1")
        while not store.check(keys):
            now = time.monotonic()
            waited = now - start
            if waited >= timeout_s or now >= next_warn:
                missing = [r for r, key in enumerate(keys) if not store.check([key])]
                if waited >= timeout_s:
                    break
                log.warning(
                    "%s %s: still waiting for worker rank(s) %s after %.0f s",
                    op,
                    name,
                    missing,
                    waited,
                )
                next_warn = now + warn_s
            time.sleep(pause)
            pause = min(pause * 2, 0.05)  # quick for tight barriers, cheap for long waits
        else:
            return
    except Exception as exc:  # the store's host (worker 0) is gone or silent
        raise UnavailableError(
            f"{op}: lost the rendezvous store at {address} ({exc}); worker 0 hosts it, "
            f"check its log",
            op=op,
            role="worker",
            rank=0,
            address=address,
        ) from None
    from ..observe.diagnose import auto_diagnose

    message = (
        f"{op}: worker rank(s) {missing} did not arrive within {waited:.1f} s "
        f"(rendezvous {address}); check their logs, or raise {setting}"
    )
    raise DeadlineError(
        message + auto_diagnose(message),
        op=op,
        role="worker",
        rank=missing,
        address=address,
        seconds=waited,
        setting=setting,
    )


def worker_backend(env: RoleEnv | None = None) -> str:
    """The ``torch.distributed`` backend of this job's worker groups.

    ``"gloo"`` in a plain job; in a secure one (``env.key_dir``, or ``SPARSEPS_SECURE``
    without ``env``) the CURVE group's (registered with torch here, on first use).
    The :class:`~sparseps.runtime.worker_group.WorkerGroup` forms every group with it; a
    secure job's group then never opens a plain socket.
    """
    key_dir = env.key_dir if env is not None else security_setting()
    if not key_dir:
        return "gloo"
    import torch.distributed as dist

    from .curve_group import BACKEND

    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _curve_group, extended_api=True, devices=["cpu"])
    return BACKEND


def _curve_group(backend_options, options):
    """torch's constructor call of a :class:`~sparseps.runtime.curve_group.CurveGroup`;
    ``options`` (``init_process_group(pg_options=)``) or, when a caller gave none, this
    process's job (its keys and role from the environment)."""
    from .curve_group import CurveGroup

    return CurveGroup(
        backend_options.store,
        backend_options.group_rank,
        backend_options.group_size,
        backend_options.timeout,
        options if options is not None else group_options(),
    )


def group_options(env: RoleEnv | None = None):
    """The :class:`~sparseps.runtime.curve_group.GroupOptions` of this worker: the job's
    keys and :func:`listen_host` (``env``: this process's role from the environment).

    Raises:
        ConfigError: the job is not secure, its keys do not load, or (several workers)
            there is no ``SPARSEPS_MASTER`` to find the job's interface by.
    """
    from .curve_group import GroupOptions

    env = env if env is not None else from_environ()
    key_dir = env.key_dir if env is not None else security_setting()
    if not key_dir:
        raise ConfigError("the secure worker group needs the job's keys (SPARSEPS_KEY_DIR)")
    host = listen_host(env.master) if env is not None and env.master else ""
    return GroupOptions(security=Security(JobKeys.load(key_dir)), host=host)


def listen_host(master: str) -> str:
    """The IP address of this host's interface toward ``master`` (``host:port``): where a
    worker's group listens, reachable by every worker that reaches the rendezvous.

    Raises:
        ConfigError: ``master`` is malformed or its host does not resolve.
    """
    host, port = parse_endpoint(master, what=MASTER)
    ip = resolve_host(host)
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, port))  # a UDP "connect" sends nothing: it only picks the route
        return str(s.getsockname()[0])
