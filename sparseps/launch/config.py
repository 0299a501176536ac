"""What to launch: one frozen :class:`LaunchConfig`, from the command line, a mapping
(an online job's YAML) or Python, checked once when it is made.

``sparseps launch`` builds it from its arguments (:meth:`LaunchConfig.from_args`),
``sparseps online`` from its YAML's ``launch`` settings (:meth:`LaunchConfig.from_dict`),
and a Python caller directly; :func:`sparseps.launch.launch` runs it on its backend.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..errors import ConfigError
from .heter_devices import parse_heter_devices
from .records import check_seconds

__all__ = ["BACKENDS", "LaunchConfig"]

BACKENDS = ("local", "ray")
_RAY_ONLY = ("address", "server_resources", "worker_resources", "heter_resources")


@dataclass(frozen=True)
class LaunchConfig:
    """A job to launch: the script, its processes, where they run and how they are kept.

    The fields are ``sparseps launch``'s options (docs/launch.md), by their ``dest``
    names: ``--server-num`` is ``server_num``, ``--file-root`` (repeatable) is
    ``file_roots``. ``metrics`` None means the default: on, off in a secure job.
    """

    script: str
    script_args: tuple[str, ...] = ()
    server_num: int | None = None
    worker_num: int | None = None
    log_dir: str = "log"
    host: str | None = None
    servers: str | None = None
    workers: str | None = None
    master: str | None = None
    job_id: str | None = None
    secure: bool | None = None
    key_dir: str | None = None
    file_roots: tuple[str, ...] | None = None
    replicas: int = 0
    heter_worker_num: int | None = None
    heter_workers: str | None = None
    heter_device: str | None = None
    max_restarts: int = 0
    grace_s: float = 5.0
    quiet_warn_s: float = 300.0
    rendezvous_timeout_s: float = 300.0
    metrics: bool | None = None
    status_port: int | None = None
    backend: str = "local"
    address: str | None = None
    server_resources: str | None = None
    worker_resources: str | None = None
    heter_resources: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables for every child

    def __post_init__(self) -> None:
        object.__setattr__(self, "script_args", tuple(self.script_args))
        if self.file_roots is not None:
            object.__setattr__(self, "file_roots", tuple(self.file_roots))
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"--backend: expected one of {', '.join(BACKENDS)}, got {self.backend!r}"
            )
        if self.heter_device:
            if not (self.heter_worker_num or self.heter_workers):
                raise ConfigError(
                    "--heter-device: the job has no heter workers (--heter-worker-num H)"
                )
            parse_heter_devices(self.heter_device)
        if self.backend != "ray":
            for name in _RAY_ONLY:
                if getattr(self, name) is not None:
                    raise ConfigError(f"--{name.replace('_', '-')} applies only to --backend ray")
        for name in ("rendezvous_timeout_s", "grace_s", "quiet_warn_s"):
            check_seconds("--" + name[:-2].replace("_", "-") + "-s", getattr(self, name))
        for name in ("replicas", "max_restarts"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')}: expected an int >= 0, got {getattr(self, name)!r}"
                )
        if self.status_port is not None and not 0 <= self.status_port <= 65535:
            raise ConfigError(f"--status-port: must be in 0..65535, got {self.status_port}")  # fmt: skip

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchConfig:
        """The config of ``sparseps launch``'s parsed arguments."""
        values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        return cls(**values)

    @classmethod
    def from_dict(cls, values: Mapping[str, object], *, where: str = "launch") -> LaunchConfig:
        """The config of a mapping (an online job's YAML); an unknown key is refused,
        naming the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(known))}")  # fmt: skip
        return cls(**values)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> LaunchConfig:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def child_settings(self) -> dict[str, str]:
        """What every child's environment gets from this config (besides its role)."""
        from ..env import FILE_ROOTS, HETER_DEVICE, REPLICAS

        out = dict(self.env)
        if self.replicas:
            out[REPLICAS] = str(self.replicas)
        if self.heter_device:
            out[HETER_DEVICE] = self.heter_device
        if self.file_roots:
            out[FILE_ROOTS] = os.pathsep.join(os.path.abspath(root) for root in self.file_roots)
        return out

    def argv(self) -> list[str]:
        """The ``sparseps launch`` command line of this config (for a launcher started as
        a process, e.g. on another node): :meth:`from_args` of it gives it back."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("script", "script_args", "env") or value == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.name == "file_roots":
                for root in value:
                    out += ["--file-root", root]
            elif isinstance(value, bool):
                out.append(flag if value else "--no-" + f.name.replace("_", "-"))
            else:
                out += [flag, str(value)]
        return [*out, self.script, *self.script_args]
