"""What to launch: one frozen :class:`LaunchConfig`, from the command line, a mapping
(an online job's YAML) or Python, checked once when it is made.

``sparseps launch`` and ``sparseps k8s`` build it from their arguments
(:meth:`LaunchConfig.from_args`), ``sparseps online`` from its YAML's job settings
(:meth:`LaunchConfig.from_dict`), ``sparseps demo`` and a Python caller directly;
:func:`sparseps.launch.launch_cli.launch` runs it on the backend ``backend`` names
(``local``, ``ray`` or ``kubernetes``: the table ``launch_cli.BACKENDS``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..errors import ConfigError
from .heter_devices import parse_heter_devices
from .records import check_seconds

__all__ = ["BACKEND_NAMES", "KubernetesConfig", "LaunchConfig"]

# the backends by name; launch_cli.BACKENDS maps each to its implementation
BACKEND_NAMES = ("local", "ray", "kubernetes")
_RAY_ONLY = ("address",)
_PLACED_ONLY = ("server_resources", "worker_resources", "heter_resources")  # ray, kubernetes
_K8S_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,40}[a-z0-9])?$")


@dataclass(frozen=True)
class KubernetesConfig:
    """What the ``kubernetes`` backend (``sparseps k8s``, :mod:`sparseps.launch.k8s`) needs
    besides the job itself: the image, the objects' names and the pods' ports and volume.

    The fields are ``sparseps k8s``'s options of the same names (docs/cluster.md).
    """

    image: str
    name: str = "sparseps"
    namespace: str = "default"
    out: str = "k8s"
    port: int = 6000
    master_port: int = 6170
    heter_port: int = 6200
    pvc: str = "sparseps-shared"
    mount: str = "/shared"

    def __post_init__(self) -> None:
        for flag, value in (("--name", self.name), ("--namespace", self.namespace)):
            if not isinstance(value, str) or not _K8S_NAME.match(value):
                raise ConfigError(
                    f"{flag} {value!r}: use lower-case letters, digits and '-' (a DNS label of "
                    "at most 42 characters, starting with a letter)"
                )
        for flag, port in (("--port", self.port), ("--master-port", self.master_port),
                           ("--heter-port", self.heter_port)):  # fmt: skip
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ConfigError(f"{flag}: must be in 1..65535, got {port}")
        if not self.mount.startswith("/"):
            raise ConfigError(f"--mount {self.mount!r}: must be an absolute path in the container")


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
    kubernetes: KubernetesConfig | None = None  # backend "kubernetes" only
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables for every child

    def __post_init__(self) -> None:
        object.__setattr__(self, "script_args", tuple(self.script_args))
        if self.file_roots is not None:
            object.__setattr__(self, "file_roots", tuple(self.file_roots))
        if self.backend not in BACKEND_NAMES:
            raise ConfigError(
                f"--backend: expected one of {', '.join(BACKEND_NAMES)}, got {self.backend!r}"
            )
        if (self.backend == "kubernetes") != (self.kubernetes is not None):
            raise ConfigError(
                "backend kubernetes needs kubernetes=KubernetesConfig(image=...), and only it "
                f"takes one (backend {self.backend!r}, kubernetes {self.kubernetes!r})"
            )
        object.__setattr__(self, "env", dict(self.env))
        if self.heter_device:
            if not (self.heter_worker_num or self.heter_workers):
                raise ConfigError(
                    "--heter-device: the job has no heter workers (--heter-worker-num H)"
                )
            parse_heter_devices(self.heter_device)
        for name in (*_RAY_ONLY, *_PLACED_ONLY):
            placed = self.backend == "ray" or (self.backend == "kubernetes" and name != "address")
            if getattr(self, name) is not None and not placed:
                raise ConfigError(f"--{name.replace('_', '-')} applies only to --backend ray")
        if self.replicas and self.backend != "local":
            raise ConfigError(
                f"--replicas {self.replicas}: only --backend local routes around and replaces "
                f"a lost server; under --backend {self.backend} the first server loss would "
                "fail the job all the same (run a replicated job with --backend local)"
            )
        if self.backend == "kubernetes" and any(
            not os.path.isabs(r) for r in self.file_roots or ()
        ):
            raise ConfigError(
                f"--file-root {list(self.file_roots or ())}: a Kubernetes job's roots are paths "
                "in its containers: give them absolute (e.g. under --mount)"
            )
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
        """The config of ``sparseps launch``'s (or ``sparseps k8s``'s) parsed arguments."""
        values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        if values.get("backend") == "kubernetes":
            values["kubernetes"] = KubernetesConfig(
                **{f.name: getattr(args, f.name) for f in fields(KubernetesConfig)}
            )
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
        values = dict(values)
        kube = values.get("kubernetes")
        if isinstance(kube, Mapping):
            known = {f.name for f in fields(KubernetesConfig)}
            if unknown := sorted(set(kube) - known):
                raise ConfigError(f"{where}.kubernetes: unknown setting(s) {', '.join(unknown)}; "
                                  f"known: {', '.join(sorted(known))}")  # fmt: skip
            values["kubernetes"] = KubernetesConfig(**kube)
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
            if f.name in ("script", "script_args", "env", "kubernetes") or value == f.default:
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
