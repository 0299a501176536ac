"""What the supervisor is given and what it returns: plain frozen records.

Kept apart from the supervision loop (``supervisor.py``) so that both stay small; the
launcher's package re-exports them.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..env import Role
from ..errors import ConfigError

__all__ = [
    "FINISHING_NOTE",
    "SERVER_EXIT_NOTE",
    "ChildSpec",
    "Failure",
    "Outcome",
    "SupervisorConfig",
    "check_seconds",
]

# Why any server exit fails the job, also one with code 0 (a server given SIGTERM exits 0).
SERVER_EXIT_NOTE = "before every worker finished (a server exit always stops the job)"
# Why a scale request is refused once every worker has exited 0 (local launcher and Ray).
FINISHING_NOTE = (
    "the job is finishing: every worker has exited 0 and its servers are being stopped, so "
    "nothing new is started (run the job again to go on)"
)
LOST_SHARD_NOTE = (
    "before every worker finished, and no live copy of shard(s) {shards} is left "
    "(lost servers: {lost}; --replicas {replicas} survives {replicas} lost server(s) per chain)"
)


def check_seconds(name: str, value: float, *, zero_ok: bool = False) -> float:
    """``value`` as a duration in seconds: a finite number > 0 (>= 0 with ``zero_ok``).

    ``value > 0`` alone accepts ``inf`` (a wait that never ends) and, being False for
    ``nan`` only by accident of the comparison, is easy to get wrong; both are refused.

    Raises:
        ConfigError: naming ``name``, the value and the accepted range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name}: must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigError(f"{name}: must be a finite number of seconds {bound}, got {value!r}")
    return seconds


@dataclass(frozen=True)
class SupervisorConfig:
    """Knobs of the supervision loop.

    Attributes:
        max_restarts: times the worker group is restarted after a worker failed, for the
            whole job (every worker starts again; servers never are restarted).
        grace_s: seconds between SIGTERM and SIGKILL when stopping children.
        quiet_warn_s: warn when a running child has written nothing for this long.
        server_stop_s: seconds servers get to exit after the stop request.
        tail_lines: log lines of a failed child shown in the outcome.
        poll_s: how often children are checked.
        replicas: backup copies per shard (``--replicas``); with replicas a lost server
            stops the job only when some shard has no live copy left.
        server_num: servers of the whole job (with ``replicas``, to find the shards'
            chains; :mod:`sparseps.core.replicas`).
    """

    max_restarts: int = 0
    grace_s: float = 5.0
    quiet_warn_s: float = 300.0
    server_stop_s: float = 10.0
    tail_lines: int = 20
    poll_s: float = 0.1
    replicas: int = 0
    server_num: int = 0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts: must be >= 0, got {self.max_restarts}")
        for name in ("grace_s", "quiet_warn_s", "server_stop_s", "poll_s"):
            check_seconds(name, getattr(self, name))
        if self.tail_lines < 0:
            raise ConfigError(f"tail_lines: must be >= 0, got {self.tail_lines}")


@dataclass(frozen=True)
class ChildSpec:
    """One process to run: its role, command line, full environment and log file."""

    role: Role
    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    echo: bool = False  # also copy its output to the console
    metrics_port: int | None = None  # where it serves /metrics (None: metrics off)
    # its script imports torch at its top level (sparseps.launch.fork_server)
    script_imports_torch: bool = False

    @property
    def name(self) -> str:
        return f"{self.role.value} {self.rank}"

    @property
    def imports_torch(self) -> bool:
        """Whether it imports torch (a worker; a server only where its script does): it is
        forked from the launcher's fork server that holds torch, or from the one without."""
        return self.role is not Role.SERVER or self.script_imports_torch


@dataclass(frozen=True)
class Failure:
    """Why the job failed: which process, its exit code (negative = signal) and log tail."""

    role: str
    rank: int
    pid: int
    exit_code: int
    log_path: str
    tail: tuple[str, ...] = ()
    remote: str = ""  # set when the launcher failed, not a child (e.g. another node's)
    note: str = ""  # why this exit fails the job when its code alone does not say

    def how(self) -> str:
        """``exited with code N`` or ``was killed by signal N (SIGNAME)``."""
        if self.exit_code >= 0:
            return f"exited with code {self.exit_code}"
        try:
            name = f" ({signal.Signals(-self.exit_code).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-self.exit_code}{name}"

    def describe(self) -> str:
        if self.remote:
            return self.remote
        note = f" {self.note}" if self.note else ""
        head = f"{self.role} {self.rank} (pid {self.pid}) {self.how()}{note}; log: {self.log_path}"
        if not self.tail:
            return head
        body = "\n".join(f"    {line}" for line in self.tail)
        return f"{head}\n  last {len(self.tail)} lines of its log:\n{body}"


@dataclass(frozen=True)
class Outcome:
    """How the job ended: ``exit_code`` is what the launcher should exit with."""

    exit_code: int
    reason: str  # "completed" | "failed" | "interrupted"
    failure: Failure | None = None
