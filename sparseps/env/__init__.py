"""The process environment: the only package that reads it (DESIGN §2.2).

:mod:`.registry` declares every variable (docs/env.md is rendered from it) and reads the
optional ones into a frozen :class:`Settings`; :mod:`.role_env` reads this process's role
(the launcher's variables, or Paddle's); :mod:`.docs` renders docs/env.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from .registry import (
    BARRIER_TIMEOUT,
    BARRIER_WARN,
    COLLECTIVE_TIMEOUT,
    DISK_DIR,
    FILE_ROOTS,
    FILE_TIMEOUT,
    FORK_SERVER,
    HETER_DEVICE,
    HETER_WORKERS,
    JOB_ID,
    KEY_DIR,
    LOG_DIR,
    MASTER,
    RANK,
    RECOVER,
    RENDEZVOUS_TIMEOUT,
    REPLICAS,
    REPLY_SLOTS,
    RESTART_COUNT,
    ROLE,
    RPC_TIMEOUT,
    SECURE,
    SERVER_START_TIMEOUT,
    SERVERS,
    SETTINGS,
    VARIABLES,
    WORKER_NUM,
    ZYGOTE_DIR,
    Setting,
    Settings,
    number,
    process_environ,
    settings,
)
from .role_env import (
    Role,
    RoleEnv,
    child_environ,
    from_environ,
    job_id_setting,
    parse_endpoint,
    security_setting,
)

__all__ = [
    "BARRIER_TIMEOUT",
    "BARRIER_WARN",
    "COLLECTIVE_TIMEOUT",
    "DISK_DIR",
    "FILE_ROOTS",
    "FILE_TIMEOUT",
    "FORK_SERVER",
    "HETER_DEVICE",
    "HETER_WORKERS",
    "JOB_ID",
    "KEY_DIR",
    "LOG_DIR",
    "MASTER",
    "RANK",
    "RECOVER",
    "RENDEZVOUS_TIMEOUT",
    "REPLICAS",
    "REPLY_SLOTS",
    "RESTART_COUNT",
    "ROLE",
    "RPC_TIMEOUT",
    "SECURE",
    "SERVERS",
    "SERVER_START_TIMEOUT",
    "SETTINGS",
    "VARIABLES",
    "WORKER_NUM",
    "ZYGOTE_DIR",
    "Role",
    "RoleEnv",
    "Setting",
    "Settings",
    "child_environ",
    "disk_dir_setting",
    "file_roots_setting",
    "from_environ",
    "heter_device_setting",
    "job_id_setting",
    "number",
    "parse_endpoint",
    "process_environ",
    "recover_setting",
    "replicas_setting",
    "security_setting",
    "settings",
]


# Views of settings() under the names their callers use.
def heter_device_setting(environ: Mapping[str, str] | None = None) -> str:
    """``SPARSEPS_HETER_DEVICE``: where a heter worker runs the dense network."""
    return settings(environ).heter_device


def file_roots_setting(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """``SPARSEPS_FILE_ROOTS``: the folders a server's file ops may touch, or None."""
    return settings(environ).file_roots


def disk_dir_setting(environ: Mapping[str, str] | None = None) -> str | None:
    """``SPARSEPS_DISK_DIR``: a server's folder for rows beyond ``memory_rows``, or None."""
    return settings(environ).disk_dir


def replicas_setting(environ: Mapping[str, str] | None = None) -> int:
    """``SPARSEPS_REPLICAS``: backup copies of every shard (0 when unset)."""
    return settings(environ).replicas


def recover_setting(environ: Mapping[str, str] | None = None) -> bool:
    """``SPARSEPS_RECOVER``: whether this server replaces a lost one."""
    return settings(environ).recover
