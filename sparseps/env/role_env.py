"""This process's role in a job (DESIGN §2.2): the launcher's role variables, or Paddle's.

The variables are declared, with their docs, in :mod:`sparseps.env.registry`
(docs/env.md). With none of the ``SPARSEPS_*`` role variables set a script runs in *local
mode* (one background server, one worker); with some but not all set,
:func:`from_environ` raises a :class:`ConfigError` naming the missing or malformed
variable: a half-configured cluster never silently falls back to local mode. Paddle's
variables (what Paddle's PS launcher and Kubernetes operator set) are read only when no
``SPARSEPS_*`` role variable is set (precedence: ``SPARSEPS_*`` > Paddle > local mode).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from ..errors import ConfigError
from .registry import (
    HETER_DEVICE,
    HETER_WORKERS,
    JOB_ID,
    KEY_DIR,
    LOG_DIR,
    MASTER,
    PADDLE_JOB_ID,
    PADDLE_LOG_DIR,
    PADDLE_MASTER,
    PADDLE_POD_IP,
    PADDLE_PORT,
    PADDLE_RANK,
    PADDLE_ROLE,
    PADDLE_SERVERS,
    PADDLE_TRAINER_ENDPOINTS,
    PADDLE_WORKER_NUM,
    RANK,
    RECOVER,
    REPLICAS,
    RESTART_COUNT,
    ROLE,
    SECURE,
    SERVERS,
    VARIABLES,
    WORKER_NUM,
    number,
    process_environ,
    settings,
)

__all__ = [
    "Role",
    "RoleEnv",
    "child_environ",
    "from_environ",
    "job_id_setting",
    "parse_endpoint",
    "security_setting",
]

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
    return int(number(name, environ[name].strip(), integer=True, least=0))


def from_environ(environ: Mapping[str, str] | None = None) -> RoleEnv | None:
    """Read the role from the environment.

    Returns:
        the RoleEnv, or None when no SPARSEPS_* role variable is set (local mode).

    Raises:
        ConfigError: some role variables are set but one is missing or malformed.
    """
    environ = process_environ() if environ is None else environ
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
        restart_count=settings(environ).restart_count,
        key_dir=security_setting(environ) or "",
        heter_workers=_list(environ.get(HETER_WORKERS, "")),
    )


def _list(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


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
    """The key folder when ``SPARSEPS_SECURE`` is on, else None (ConfigError: malformed, or
    on without ``SPARSEPS_KEY_DIR``)."""
    found = settings(environ)
    return found.key_dir if found.secure else None


def job_id_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's job id (``SPARSEPS_JOB_ID``, else the one Paddle's variables give),
    or None when it is not part of a job."""
    environ = process_environ() if environ is None else environ
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
    dropped = {*VARIABLES, RESTART_COUNT, SECURE, KEY_DIR, REPLICAS, RECOVER, HETER_WORKERS,
               HETER_DEVICE}  # fmt: skip
    child = {k: v for k, v in process_environ().items() if k not in dropped}
    child.update(overrides)
    return child
