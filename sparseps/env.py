"""The only module that reads the process environment (DESIGN §2.2).

The launcher sets these variables for every process it starts:

========================  =====================================================
``SPARSEPS_ROLE``         ``server``, ``worker`` or ``heter_worker``
``SPARSEPS_RANK``         rank within the role, ``0..N-1``
``SPARSEPS_SERVERS``      ``host:port,host:port,...``; index = server rank
``SPARSEPS_WORKER_NUM``   number of workers in the job
``SPARSEPS_MASTER``       ``host:port`` of the gloo rendezvous among workers
``SPARSEPS_LOG_DIR``      folder of the per-role log files
``SPARSEPS_JOB_ID``       an id shared by every process of one job
========================  =====================================================

``SPARSEPS_RESTART_COUNT`` (optional, default 0) is the worker group's restart generation:
0 for the first start, ``k`` after the launcher's ``k``-th restart (``--max-restarts``), so
that a script knows when to resume from its last checkpoint.

``SPARSEPS_SECURE`` (optional, ``1``/``0``, default 0) turns on authenticated, encrypted
transport (docs/security.md); ``SPARSEPS_KEY_DIR`` is then the folder holding the job's key
pair (written by ``sparseps keys DIR``). Only the folder's path travels in the
environment, never a key. Both are honoured in local mode too, for clients of a secure job.

``SPARSEPS_HETER_WORKERS`` (optional, ``host:port,...``; index = heter worker rank) lists
the job's heter workers (``sparseps launch --heter-worker-num H``, docs/heterps.md): set,
the workers train in heter mode and a ``heter_worker`` process serves the dense network at
its entry; ``SPARSEPS_HETER_DEVICE`` (optional, ``cpu``/``cuda``/``auto``, default ``cpu``)
is where a heter worker runs it.

``SPARSEPS_DISK_DIR`` (optional, an absolute path) is a server's folder for the rows of
tables with ``memory_rows`` beyond that budget (docs/table.md; ``--disk-dir`` overrides it).

With none of them set a script runs in *local mode* (one background server, one
worker). With some but not all set, :func:`from_environ` raises a :class:`ConfigError`
naming the missing or malformed variable: a half-configured cluster never silently
falls back to local mode.

**Paddle's variables** (what Paddle's PS launcher and Kubernetes operator set), read only
when *no* ``SPARSEPS_*`` role variable is set and ``TRAINING_ROLE`` or
``PADDLE_PSERVERS_IP_PORT_LIST`` is (precedence: ``SPARSEPS_*`` > Paddle > local mode):

=================================  ===================================================
``TRAINING_ROLE``                  ``PSERVER`` -> server, ``TRAINER`` -> worker
``PADDLE_PSERVERS_IP_PORT_LIST``   the servers, ``ip:port,...`` (= ``SPARSEPS_SERVERS``)
``PADDLE_TRAINERS_NUM``            number of workers
``PADDLE_TRAINER_ID``              a worker's rank (workers only)
``POD_IP``, ``PADDLE_PORT``        a server's endpoint; its rank is the position of
                                   ``POD_IP:PADDLE_PORT`` in the server list
``PADDLE_MASTER``                  (optional) the rendezvous ``host:port``; else the
                                   first entry of ``PADDLE_TRAINER_ENDPOINTS`` (worker
                                   0's endpoint); else server 0's host with the port
                                   one above the highest server port (right only when
                                   worker 0 runs on server 0's host)
``PADDLE_JOB_ID``                  (optional) the job id; else ``paddle-`` and a hash of
                                   the server list and the worker count (the same in
                                   every process of the job)
``PADDLE_LOG_DIR``                 (optional) the log folder, default ``log``
=================================  ===================================================

A missing or malformed one raises a :class:`ConfigError` naming it. docs/launch.md has
the same table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from .errors import ConfigError

__all__ = [
    "HETER_DEVICE",
    "HETER_WORKERS",
    "KEY_DIR",
    "RESTART_COUNT",
    "SECURE",
    "VARIABLES",
    "Role",
    "RoleEnv",
    "child_environ",
    "float_setting",
    "heter_device_setting",
    "from_environ",
    "parse_endpoint",
    "security_setting",
]

ROLE = "SPARSEPS_ROLE"
RANK = "SPARSEPS_RANK"
SERVERS = "SPARSEPS_SERVERS"
WORKER_NUM = "SPARSEPS_WORKER_NUM"
MASTER = "SPARSEPS_MASTER"
LOG_DIR = "SPARSEPS_LOG_DIR"
JOB_ID = "SPARSEPS_JOB_ID"
VARIABLES = (ROLE, RANK, SERVERS, WORKER_NUM, MASTER, LOG_DIR, JOB_ID)
# Set by the launcher too, but optional (absent = 0): not part of the all-or-nothing rule.
RESTART_COUNT = "SPARSEPS_RESTART_COUNT"
# Authenticated transport (optional; absent = off): a switch and the key folder's path.
SECURE = "SPARSEPS_SECURE"
KEY_DIR = "SPARSEPS_KEY_DIR"
# Heterogeneous PS (optional; absent = no heter workers): their endpoints and device.
HETER_WORKERS = "SPARSEPS_HETER_WORKERS"
HETER_DEVICE = "SPARSEPS_HETER_DEVICE"

# Optional tuning knobs (not part of the role contract; absent means default).
RPC_TIMEOUT = "SPARSEPS_RPC_TIMEOUT"
FILE_TIMEOUT = "SPARSEPS_FILE_TIMEOUT"  # save/load ops, apart from the data plane's timeout
FILE_ROOTS = "SPARSEPS_FILE_ROOTS"  # os.pathsep-separated folders a server's file ops may use
DISK_DIR = "SPARSEPS_DISK_DIR"  # a server's folder for the rows of tables beyond memory_rows
REPLICAS = "SPARSEPS_REPLICAS"  # copies of each shard beyond the primary (sparseps.core.replicas)
REPLY_SLOTS = "SPARSEPS_REPLY_SLOTS"  # a client's shared-memory reply slots per same-host server
RECOVER = "SPARSEPS_RECOVER"  # "1": a replacement server, copies its shards from survivors
BARRIER_WARN = "SPARSEPS_BARRIER_WARN_S"
BARRIER_TIMEOUT = "SPARSEPS_BARRIER_TIMEOUT_S"
RENDEZVOUS_TIMEOUT = "SPARSEPS_RENDEZVOUS_TIMEOUT_S"
COLLECTIVE_TIMEOUT = "SPARSEPS_COLLECTIVE_TIMEOUT_S"
SERVER_START_TIMEOUT = "SPARSEPS_SERVER_START_TIMEOUT_S"
FORK_SERVER = "SPARSEPS_FORK_SERVER"  # "0": launchers start every child as a fresh interpreter
# a folder (mode 700) where launchers keep warm fork servers between jobs (launch.zygote)
ZYGOTE_DIR = "SPARSEPS_ZYGOTE_DIR"


_ROLE_NAMES = "'server', 'worker' or 'heter_worker'"


class Role(StrEnum):
    SERVER = "server"
    WORKER = "worker"
    HETER_WORKER = "heter_worker"  # the dense network of heter mode (docs/heterps.md)


def parse_endpoint(text: str, *, what: str = "endpoint") -> tuple[str, int]:
    """Split ``host:port`` into ``(host, port)``; raises ConfigError naming ``what``."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what}: expected host:port, got {text!r}")
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{what}: port must be an integer, got {text!r}") from None
    if not 0 < number < 65536:
        raise ConfigError(f"{what}: port must be in 1..65535, got {number}")
    return host, number


@dataclass(frozen=True)
class RoleEnv:
    """The role of this process in a job. Tests build it directly.

    ``local`` is True when no SPARSEPS_* variable was set (local mode);
    ``restart_count`` is the worker group's restart generation (``SPARSEPS_RESTART_COUNT``);
    ``key_dir`` is the job's key folder when transport security is on, else empty;
    ``heter_workers`` the ``host:port`` of each heter worker (empty: none).
    """

    role: Role
    rank: int
    servers: tuple[str, ...]
    worker_num: int
    master: str
    log_dir: str
    job_id: str
    local: bool = False
    restart_count: int = 0
    key_dir: str = ""
    heter_workers: tuple[str, ...] = ()

    @property
    def secure(self) -> bool:
        """Whether the job's sockets use CURVE with the keys in :attr:`key_dir`."""
        return bool(self.key_dir)

    def __post_init__(self) -> None:
        if self.restart_count < 0:
            raise ConfigError(f"{RESTART_COUNT}: must be >= 0, got {self.restart_count}")
        if not isinstance(self.role, Role):
            raise ConfigError(f"{ROLE}: expected {_ROLE_NAMES}, got {self.role!r}")
        if self.worker_num < 1:
            raise ConfigError(f"{WORKER_NUM}: must be >= 1, got {self.worker_num}")
        limit = {Role.SERVER: len(self.servers), Role.HETER_WORKER: len(self.heter_workers)}.get(
            self.role, self.worker_num
        )
        if not 0 <= self.rank < max(limit, 1):
            raise ConfigError(
                f"{RANK}: {self.rank} out of range 0..{limit - 1} for role {self.role.value}"
            )
        if not self.local:
            for i, ep in enumerate(self.servers):
                parse_endpoint(ep, what=f"{SERVERS}[{i}]")
            if not self.servers:
                raise ConfigError(f"{SERVERS}: needs at least one host:port")
            parse_endpoint(self.master, what=MASTER)
            for i, ep in enumerate(self.heter_workers):
                parse_endpoint(ep, what=f"{HETER_WORKERS}[{i}]")

    def to_environ(self) -> dict[str, str]:
        """The variables that describe this role, for a child process."""
        return {
            ROLE: self.role.value,
            RANK: str(self.rank),
            SERVERS: ",".join(self.servers),
            WORKER_NUM: str(self.worker_num),
            MASTER: self.master,
            LOG_DIR: self.log_dir,
            JOB_ID: self.job_id,
            RESTART_COUNT: str(self.restart_count),
            **({SECURE: "1", KEY_DIR: self.key_dir} if self.key_dir else {}),
            **({HETER_WORKERS: ",".join(self.heter_workers)} if self.heter_workers else {}),
        }


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {environ[name]!r}") from None


def from_environ(environ: Mapping[str, str] | None = None) -> RoleEnv | None:
    """Read the role from the environment.

    Returns:
        the RoleEnv, or None when no SPARSEPS_* role variable is set (local mode).

    Raises:
        ConfigError: some role variables are set but one is missing or malformed.
    """
    environ = os.environ if environ is None else environ
    present = [v for v in VARIABLES if environ.get(v)]
    if not present:
        return _from_paddle(environ)
    missing = [v for v in VARIABLES if not environ.get(v)]
    if missing:
        raise ConfigError(
            f"{missing[0]} is not set, but {present[0]} is: a cluster process needs all of "
            f"{', '.join(VARIABLES)} (unset all of them to run in local mode)"
        )
    role_text = environ[ROLE].strip().lower()
    try:
        role = Role(role_text)
    except ValueError:
        raise ConfigError(f"{ROLE}: expected {_ROLE_NAMES}, got {role_text!r}") from None
    return RoleEnv(
        role=role,
        rank=_int(environ, RANK),
        servers=tuple(s.strip() for s in environ[SERVERS].split(",") if s.strip()),
        worker_num=_int(environ, WORKER_NUM),
        master=environ[MASTER].strip(),
        log_dir=environ[LOG_DIR],
        job_id=environ[JOB_ID],
        restart_count=_int(environ, RESTART_COUNT) if environ.get(RESTART_COUNT) else 0,
        key_dir=security_setting(environ) or "",
        heter_workers=_list(environ.get(HETER_WORKERS, "")),
    )


def _list(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def heter_device_setting(environ: Mapping[str, str] | None = None) -> str:
    """``SPARSEPS_HETER_DEVICE``: where a heter worker runs the dense network (default cpu)."""
    environ = os.environ if environ is None else environ
    value = environ.get(HETER_DEVICE, "").strip().lower() or "cpu"
    if value not in ("cpu", "cuda", "auto"):
        raise ConfigError(f"{HETER_DEVICE}: expected cpu, cuda or auto, got {value!r}")
    return value


# Paddle's role variables (read only when no SPARSEPS_* role variable is set).
PADDLE_ROLE = "TRAINING_ROLE"
PADDLE_SERVERS = "PADDLE_PSERVERS_IP_PORT_LIST"
PADDLE_WORKER_NUM = "PADDLE_TRAINERS_NUM"
PADDLE_RANK = "PADDLE_TRAINER_ID"
PADDLE_POD_IP = "POD_IP"
PADDLE_PORT = "PADDLE_PORT"
PADDLE_MASTER = "PADDLE_MASTER"
PADDLE_TRAINER_ENDPOINTS = "PADDLE_TRAINER_ENDPOINTS"
PADDLE_JOB_ID = "PADDLE_JOB_ID"
PADDLE_LOG_DIR = "PADDLE_LOG_DIR"
PADDLE_VARIABLES = (PADDLE_ROLE, PADDLE_SERVERS, PADDLE_WORKER_NUM, PADDLE_RANK, PADDLE_POD_IP,
                    PADDLE_PORT, PADDLE_MASTER, PADDLE_TRAINER_ENDPOINTS, PADDLE_JOB_ID,
                    PADDLE_LOG_DIR)  # fmt: skip
_PADDLE_ROLES = {"PSERVER": Role.SERVER, "TRAINER": Role.WORKER}


def _need(environ: Mapping[str, str], name: str, why: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigError(
            f"{name} is not set, but {PADDLE_ROLE}/{PADDLE_SERVERS} are: a Paddle-style "
            f"cluster process needs it ({why}); or set the SPARSEPS_* variables instead"
        )
    return value


def _from_paddle(environ: Mapping[str, str]) -> RoleEnv | None:
    """The role from Paddle's variables (see the module docstring), or None if unset."""
    if not (environ.get(PADDLE_ROLE, "").strip() or environ.get(PADDLE_SERVERS, "").strip()):
        return None
    import hashlib

    role_text = _need(environ, PADDLE_ROLE, "PSERVER or TRAINER").upper()
    role = _PADDLE_ROLES.get(role_text)
    if role is None:
        raise ConfigError(
            f"{PADDLE_ROLE}: expected PSERVER or TRAINER, got {environ[PADDLE_ROLE]!r}"
            + (" (heter trainers: use sparseps launch --heter-worker-num)" if "HETER" in role_text else "")
        )  # fmt: skip
    servers_text = _need(environ, PADDLE_SERVERS, "the servers, ip:port,...")
    servers = tuple(s.strip() for s in servers_text.split(",") if s.strip())
    ports = [parse_endpoint(ep, what=f"{PADDLE_SERVERS}[{i}]") for i, ep in enumerate(servers)]
    _need(environ, PADDLE_WORKER_NUM, "the number of trainers")
    worker_num = _int(environ, PADDLE_WORKER_NUM)
    if worker_num < 1:
        raise ConfigError(f"{PADDLE_WORKER_NUM}: must be >= 1, got {worker_num}")
    if role is Role.WORKER:
        _need(environ, PADDLE_RANK, "this trainer's rank")
        rank = _int(environ, PADDLE_RANK)
        if not 0 <= rank < worker_num:
            raise ConfigError(
                f"{PADDLE_RANK}: {rank} out of range 0..{worker_num - 1} ({PADDLE_WORKER_NUM})"
            )
    else:
        host = _need(environ, PADDLE_POD_IP, "this server's address")
        port = _need(environ, PADDLE_PORT, "this server's port")
        endpoint = f"{host}:{port}"
        parse_endpoint(endpoint, what=f"{PADDLE_POD_IP}:{PADDLE_PORT}")
        if endpoint not in servers:
            raise ConfigError(
                f"{PADDLE_POD_IP}:{PADDLE_PORT} = {endpoint} is not in {PADDLE_SERVERS} "
                f"({servers_text}): a server's rank is its position in that list"
            )
        rank = servers.index(endpoint)
    master = environ.get(PADDLE_MASTER, "").strip()
    what = PADDLE_MASTER
    if not master and environ.get(PADDLE_TRAINER_ENDPOINTS, "").strip():
        master = environ[PADDLE_TRAINER_ENDPOINTS].split(",")[0].strip()
        what = f"{PADDLE_TRAINER_ENDPOINTS}[0]"
    if not master:
        master_port = max(p for _, p in ports) + 1
        if master_port > 65535:
            raise ConfigError(
                f"{PADDLE_MASTER} is not set and the derived rendezvous port {master_port} "
                f"(highest port of {PADDLE_SERVERS} + 1) is out of range; set {PADDLE_MASTER}"
            )
        master = f"{ports[0][0]}:{master_port}"
        what = f"{PADDLE_MASTER} (derived from {PADDLE_SERVERS})"
    parse_endpoint(master, what=what)
    job_id = environ.get(PADDLE_JOB_ID, "").strip()
    if not job_id:
        digest = hashlib.sha256(f"{','.join(servers)}|{worker_num}".encode()).hexdigest()
        job_id = f"paddle-{digest[:12]}"
    return RoleEnv(
        role=role, rank=rank, servers=servers, worker_num=worker_num, master=master,
        log_dir=environ.get(PADDLE_LOG_DIR, "").strip() or "log", job_id=job_id,
        key_dir=security_setting(environ) or "",
    )  # fmt: skip


def security_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """The key folder when ``SPARSEPS_SECURE`` is on, else None.

    Raises:
        ConfigError: ``SPARSEPS_SECURE`` is not a boolean, or it is on and
            ``SPARSEPS_KEY_DIR`` is not set.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(SECURE, "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return None
    if text not in ("1", "true", "yes", "on"):
        raise ConfigError(f"{SECURE}: expected 1 or 0, got {environ[SECURE]!r}")
    key_dir = environ.get(KEY_DIR, "").strip()
    if not key_dir:
        raise ConfigError(
            f"{KEY_DIR} is not set, but {SECURE} is on: point it at the job's key folder "
            "(made by `sparseps keys DIR`)"
        )
    return key_dir


def float_setting(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """An optional float knob from the environment (e.g. SPARSEPS_RPC_TIMEOUT)."""
    environ = os.environ if environ is None else environ
    text = environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}: expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:  # "inf" would disable a deadline silently
        raise ConfigError(f"{name}: must be a finite number > 0, got {text!r}")
    return value


def file_roots_setting(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The servers' file roots (``SPARSEPS_FILE_ROOTS``), or None when not set.

    Raises:
        ConfigError: a root is not an absolute path.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(FILE_ROOTS, "")
    roots = tuple(part for part in text.split(os.pathsep) if part.strip())
    for root in roots:
        if not os.path.isabs(root):
            raise ConfigError(f"{FILE_ROOTS}: {root!r} is not an absolute path")
    return roots or None


def disk_dir_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """The servers' disk dir (``SPARSEPS_DISK_DIR``) for tables with ``memory_rows``, or None.

    Raises:
        ConfigError: it is not an absolute path.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(DISK_DIR, "").strip()
    if text and not os.path.isabs(text):
        raise ConfigError(f"{DISK_DIR}: {text!r} is not an absolute path")
    return text or None


def replicas_setting(environ: Mapping[str, str] | None = None) -> int:
    """Backup copies of every shard (``SPARSEPS_REPLICAS``; 0 when unset).

    Raises:
        ConfigError: not an int >= 0.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(REPLICAS, "").strip()
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"{REPLICAS}: expected an int >= 0 (backup copies per shard), got {text!r}"
        )
    return value


def reply_slots_setting(default: int, most: int, environ: Mapping[str, str] | None = None) -> int:
    """Reply slots a client asks of each server on its host (``SPARSEPS_REPLY_SLOTS``, 0:
    off; ``default`` when unset). Raises ConfigError unless an int in ``0..most``."""
    text = (os.environ if environ is None else environ).get(REPLY_SLOTS, "").strip()
    value = int(text) if text.isdigit() else -1 if text else default
    if not 0 <= value <= most:
        raise ConfigError(f"{REPLY_SLOTS}: expected an int in 0..{most} (0: off), got {text!r}")
    return value


def recover_setting(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this server replaces a lost one (``SPARSEPS_RECOVER=1``, set by the launcher)."""
    environ = os.environ if environ is None else environ
    return environ.get(RECOVER, "").strip() == "1"


def job_id_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's job id (``SPARSEPS_JOB_ID``, else the one Paddle's variables give),
    or None when it is not part of a job."""
    environ = os.environ if environ is None else environ
    if environ.get(JOB_ID):
        return environ[JOB_ID]
    if any(environ.get(v) for v in VARIABLES):
        return None
    paddle = _from_paddle(environ)
    return paddle.job_id if paddle is not None else None


def child_environ(overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment for a child process: this one's, minus role variables, plus ``overrides``.

    Role variables of this process are dropped first so that a child never inherits half
    of a role (e.g. a launcher started from inside a worker); the launcher passes the
    child's full role in ``overrides`` (``RoleEnv.to_environ()``).
    """
    dropped = {
        *VARIABLES,
        RESTART_COUNT,
        SECURE,
        KEY_DIR,
        REPLICAS,
        RECOVER,
        HETER_WORKERS,
        HETER_DEVICE,
    }
    child = {k: v for k, v in os.environ.items() if k not in dropped}
    child.update(overrides)
    return child
