"""Every environment variable sparseps reads, declared once: name, kind, default, doc, check.

The role variables (the launcher's contract, DESIGN §2.2) and Paddle's are declared here
and read as a whole by :func:`sparseps.env.from_environ`, because they hold or fail
together; every other variable is one field of the frozen :class:`Settings` that
:func:`settings` reads. Numbers go through one validator, :func:`number`. This package is
the only code that touches ``os.environ`` (tests/test_env.py checks every module), and
docs/env.md is rendered from :data:`SETTINGS` (``python -m sparseps.env``; a test keeps it
in step).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, fields

from ..errors import ConfigError

__all__ = [
    "GROUPS",
    "SETTINGS",
    "Setting",
    "Settings",
    "number",
    "process_environ",
    "settings",
]

ROLE = "SPARSEPS_ROLE"
RANK = "SPARSEPS_RANK"
SERVERS = "SPARSEPS_SERVERS"
WORKER_NUM = "SPARSEPS_WORKER_NUM"
MASTER = "SPARSEPS_MASTER"
LOG_DIR = "SPARSEPS_LOG_DIR"
JOB_ID = "SPARSEPS_JOB_ID"
VARIABLES = (ROLE, RANK, SERVERS, WORKER_NUM, MASTER, LOG_DIR, JOB_ID)  # all or none
RESTART_COUNT = "SPARSEPS_RESTART_COUNT"
SECURE = "SPARSEPS_SECURE"
KEY_DIR = "SPARSEPS_KEY_DIR"
HETER_WORKERS = "SPARSEPS_HETER_WORKERS"
HETER_DEVICE = "SPARSEPS_HETER_DEVICE"
REPLICAS = "SPARSEPS_REPLICAS"
RECOVER = "SPARSEPS_RECOVER"
FILE_ROOTS = "SPARSEPS_FILE_ROOTS"
DISK_DIR = "SPARSEPS_DISK_DIR"
RPC_TIMEOUT = "SPARSEPS_RPC_TIMEOUT"
FILE_TIMEOUT = "SPARSEPS_FILE_TIMEOUT"
REPLY_SLOTS = "SPARSEPS_REPLY_SLOTS"
RENDEZVOUS_TIMEOUT = "SPARSEPS_RENDEZVOUS_TIMEOUT_S"
BARRIER_TIMEOUT = "SPARSEPS_BARRIER_TIMEOUT_S"
BARRIER_WARN = "SPARSEPS_BARRIER_WARN_S"
COLLECTIVE_TIMEOUT = "SPARSEPS_COLLECTIVE_TIMEOUT_S"
SERVER_START_TIMEOUT = "SPARSEPS_SERVER_START_TIMEOUT_S"
FORK_SERVER = "SPARSEPS_FORK_SERVER"
ZYGOTE_DIR = "SPARSEPS_ZYGOTE_DIR"
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

# what each kind accepts; the docs' "Value" column
_KINDS = {
    "text": "text",
    "role": "`server`, `worker` or `heter_worker`",
    "int": "an integer",
    "endpoint": "`host:port`",
    "endpoints": "`host:port,host:port,...`",
    "path": "an absolute path",
    "paths": "absolute paths joined by `os.pathsep`",
    "seconds": "seconds, a finite number > 0",
    "count": "an integer >= 0",
    "switch": "`1` or `0` (also true/false, yes/no, on/off)",
    "choice": "one of",
}
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")

GROUPS = {
    "role": "Set by the launcher for every process (all or none: with some but not all set, "
    "a process refuses to start, naming the missing one; with none it runs in local mode)",
    "job": "Set by the launcher where they apply",
    "tuning": "Optional knobs (unset: the default)",
    "paddle": "Paddle's launcher variables, read only when no `SPARSEPS_*` role variable is "
    "set and `TRAINING_ROLE` or `PADDLE_PSERVERS_IP_PORT_LIST` is",
}


def number(name: str, text: str, *, integer: bool, least: float, above: bool = False,
           most: float | None = None, what: str = "") -> float:  # fmt: skip
    """The one numeric check: ``text`` parsed as an int or a finite float, at least ``least``
    (strictly above it with ``above``), at most ``most``. Raises ConfigError naming ``name``."""
    wanted = (
        f"{'an integer' if integer else 'a finite number'} {'>' if above else '>='} {least:g}"
        + (f" and <= {most:g}" if most is not None else "")
        + (f" ({what})" if what else "")
    )
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise ConfigError(f"{name}: expected {wanted}, got {text!r}") from None
    if (not math.isfinite(value) or (value <= least if above else value < least)
            or (most is not None and value > most)):  # fmt: skip
        # "inf" would disable a deadline silently
        raise ConfigError(f"{name}: expected {wanted}, got {text!r}")
    return value


@dataclass(frozen=True)
class Setting:
    """One environment variable. ``field`` is its attribute on :class:`Settings` ("" for
    the role and Paddle variables, which :func:`sparseps.env.from_environ` reads together)."""

    name: str
    group: str
    kind: str
    doc: str
    default: object = None
    field: str = ""
    choices: tuple[str, ...] = ()
    most: int | None = None

    def parse(self, text: str | None) -> object:
        """The value of ``text`` (None or blank: the default). Raises ConfigError naming
        the variable, what it expects and what it got."""
        if text is None or not text.strip():
            return self.default
        text = text.strip()
        kind = self.kind
        if kind == "seconds":
            return number(self.name, text, integer=False, least=0, above=True, what="seconds")
        if kind in ("count", "int"):
            return int(number(self.name, text, integer=True, least=0, most=self.most))
        if kind == "switch":
            if text.lower() not in _ON + _OFF:
                raise ConfigError(f"{self.name}: expected 1 or 0, got {text!r}")
            return text.lower() in _ON
        if kind == "choice":
            if text.lower() not in self.choices:
                raise ConfigError(
                    f"{self.name}: expected {', '.join(self.choices)}, got {text.lower()!r}"
                )
            return text.lower()
        if kind == "path":
            if not os.path.isabs(text):
                raise ConfigError(f"{self.name}: {text!r} is not an absolute path")
            return text
        if kind == "paths":
            roots = tuple(part for part in text.split(os.pathsep) if part.strip())
            for root in roots:
                if not os.path.isabs(root):
                    raise ConfigError(f"{self.name}: {root!r} is not an absolute path")
            return roots or self.default
        return text

    @property
    def value_doc(self) -> str:
        """What the variable accepts, for docs/env.md."""
        if self.kind == "choice":
            return "one of " + ", ".join(f"`{c}`" for c in self.choices)
        if self.kind == "count" and self.most is not None:
            return f"an integer in 0..{self.most}"
        return _KINDS[self.kind]


def _s(name: str, group: str, kind: str, doc: str, **more: object) -> Setting:
    return Setting(name=name, group=group, kind=kind, doc=doc, **more)  # type: ignore[arg-type]


SETTINGS: tuple[Setting, ...] = (
    _s(ROLE, "role", "role", "this process's role"),
    _s(RANK, "role", "int", "rank within the role, `0..N-1`"),
    _s(SERVERS, "role", "endpoints", "the servers; index = server rank"),
    _s(WORKER_NUM, "role", "int", "number of workers in the job"),
    _s(MASTER, "role", "endpoint", "the workers' rendezvous store"),
    _s(LOG_DIR, "role", "text", "folder of the per-role log files"),
    _s(JOB_ID, "role", "text", "an id shared by every process of one job"),
    _s(RESTART_COUNT, "job", "count",
       "the worker group's restart generation: 0 at the first start, k after the launcher's "
       "k-th restart (`--max-restarts`), so a script knows to resume from its checkpoint",
       default=0, field="restart_count"),
    _s(SECURE, "job", "switch",
       "authenticated, encrypted transport (docs/security.md); honoured in local mode too",
       default=False, field="secure"),
    _s(KEY_DIR, "job", "text",
       "with `SPARSEPS_SECURE`: the folder of the job's key pair (`sparseps keys DIR`); only "
       "the folder's path travels in the environment, never a key", default="",
       field="key_dir"),
    _s(HETER_WORKERS, "job", "endpoints",
       "the job's heter workers (`--heter-worker-num`, docs/heterps.md); index = heter rank; "
       "set, the workers train in heter mode", default=""),
    _s(HETER_DEVICE, "job", "choice",
       "where a heter worker runs the dense network", default="cpu",
       choices=("cpu", "cuda", "auto"), field="heter_device"),
    _s(REPLICAS, "job", "count",
       "backup copies of every shard (`--replicas`, docs/replication.md)", default=0,
       field="replicas"),
    _s(RECOVER, "job", "switch",
       "set by the launcher on a replacement server: it copies its shards from the survivors",
       default=False, field="recover"),
    _s(FILE_ROOTS, "job", "paths",
       "the folders a server's file ops (save, load, dumps) may touch (`--file-root`)",
       field="file_roots"),
    _s(DISK_DIR, "job", "path",
       "a server's folder for the rows of tables beyond `memory_rows` (docs/table.md; "
       "`--disk-dir` overrides it)", field="disk_dir"),
    _s(RPC_TIMEOUT, "tuning", "seconds", "a client's deadline for one request",
       default=60.0, field="rpc_timeout_s"),
    _s(FILE_TIMEOUT, "tuning", "seconds",
       "a client's deadline for save and load ops, apart from the data plane's",
       default=1800.0, field="file_timeout_s"),
    _s(REPLY_SLOTS, "tuning", "count",
       "shared-memory reply slots a client asks of each server on its host (0: off)",
       default=8, most=64, field="reply_slots"),
    _s(RENDEZVOUS_TIMEOUT, "tuning", "seconds",
       "how long `sps.init()` waits for every worker at the rendezvous", default=300.0,
       field="rendezvous_timeout_s"),
    _s(BARRIER_TIMEOUT, "tuning", "seconds",
       "how long a worker barrier (and `stop()`) waits for the others", default=1800.0,
       field="barrier_timeout_s"),
    _s(BARRIER_WARN, "tuning", "seconds",
       "how often a waiting barrier logs the workers still missing", default=60.0,
       field="barrier_warn_s"),
    _s(COLLECTIVE_TIMEOUT, "tuning", "seconds",
       "the workers' process group's limit on one collective", default=1800.0,
       field="collective_timeout_s"),
    _s(SERVER_START_TIMEOUT, "tuning", "seconds",
       "how long local mode waits for its background server", default=60.0,
       field="server_start_timeout_s"),
    _s(FORK_SERVER, "tuning", "switch",
       "launchers fork their children from a warm fork server (`0`: each a fresh "
       "interpreter)", default=True, field="fork_server"),
    _s(ZYGOTE_DIR, "tuning", "text",
       "a folder (mode 700) where launchers keep warm fork servers between jobs",
       default="", field="zygote_dir"),
    _s(PADDLE_ROLE, "paddle", "text", "`PSERVER` -> server, `TRAINER` -> worker"),
    _s(PADDLE_SERVERS, "paddle", "endpoints", "the servers"),
    _s(PADDLE_WORKER_NUM, "paddle", "int", "number of workers"),
    _s(PADDLE_RANK, "paddle", "int", "a worker's rank (workers only)"),
    _s(PADDLE_POD_IP, "paddle", "text", "a server's address; its rank is the position of "
       "`POD_IP:PADDLE_PORT` in the server list"),
    _s(PADDLE_PORT, "paddle", "int", "a server's port"),
    _s(PADDLE_MASTER, "paddle", "endpoint",
       "the rendezvous; else the first of `PADDLE_TRAINER_ENDPOINTS`; else server 0's host, "
       "one port above the highest server port (right only when worker 0 runs there)"),
    _s(PADDLE_TRAINER_ENDPOINTS, "paddle", "endpoints", "the trainers' endpoints"),
    _s(PADDLE_JOB_ID, "paddle", "text",
       "the job id; else `paddle-` and a hash of the server list and the worker count"),
    _s(PADDLE_LOG_DIR, "paddle", "text", "the log folder", default="log"),
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """This process's settings: every declared variable with a field, parsed and checked."""

    restart_count: int
    secure: bool
    key_dir: str
    heter_device: str
    replicas: int
    recover: bool
    file_roots: tuple[str, ...] | None
    disk_dir: str | None
    rpc_timeout_s: float
    file_timeout_s: float
    reply_slots: int
    rendezvous_timeout_s: float
    barrier_timeout_s: float
    barrier_warn_s: float
    collective_timeout_s: float
    server_start_timeout_s: float
    fork_server: bool
    zygote_dir: str

    def __post_init__(self) -> None:
        if self.secure and not self.key_dir:
            raise ConfigError(
                f"{KEY_DIR} is not set, but {SECURE} is on: point it at the job's key folder "
                "(made by `sparseps keys DIR`)"
            )

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Settings:
        """Parse every field's variable of ``environ``: the first bad one raises ConfigError."""
        values = {s.field: s.parse(environ.get(s.name)) for s in SETTINGS if s.field}
        return cls(**values)  # type: ignore[arg-type]


_FIELDS = tuple(s.name for s in SETTINGS if s.field)
assert {f.name for f in fields(Settings)} == {s.field for s in SETTINGS if s.field}
_cache: dict[tuple[str | None, ...], Settings] = {}


def process_environ() -> MutableMapping[str, str]:
    """This process's environment: the one reference to ``os.environ`` outside this module's
    readers (a launcher copies it for a child, a forked child replaces it)."""
    return os.environ


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``environ`` (default: this process's environment).

    The process's own are read once per distinct value of the declared variables: a later
    call costs a dict lookup, and a test that changes a variable sees the change.
    """
    if environ is not None:
        return Settings.read(environ)
    key = tuple(os.environ.get(name) for name in _FIELDS)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = Settings.read(os.environ)
    return found
