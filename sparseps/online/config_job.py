"""The ``job`` section of an online config: the processes, the training mode and where
they run (this machine, or a Ray cluster with per-role resources).

One of the sections :class:`sparseps.online.config.OnlineConfig` is made of; each
section is its own frozen dataclass, validated at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..worker.strategy import Strategy
from .config_mode import mode_from_config
from .config_values import check_choice, check_float, check_int, check_resources, check_str

if TYPE_CHECKING:
    from ..worker.strategy import Mode

__all__ = ["JobConfig"]

_LIBRARY = Strategy()  # the defaults of the job's Strategy knobs

# LaunchConfig fields the job section sets (sparseps.online.online_cli.launch_config)
_SET_BY_JOB = {
    "script", "script_args", "server_num", "worker_num", "log_dir", "job_id",
    "heter_worker_num", "heter_device", "backend", "address", "server_resources",
    "worker_resources", "status_port",
}  # fmt: skip


@dataclass(frozen=True)
class JobConfig:
    """Processes and training mode.

    Args:
        server_num, worker_num: processes the launcher starts (1..64).
        mode: any :class:`sparseps.Strategy` mode, by name (``sync``, exact and
            reproducible; ``async``, ``geo``, ``hybrid``, ``heter``) or as a mapping of its
            name and knobs (``{name: async, max_staleness: 4}``, ``{name: sync,
            backup_workers: 1}``; :mod:`sparseps.online.config_mode`).
        heter_worker_num: heter workers (``sparseps launch --heter-worker-num``): the
            dense network runs on them (mode ``heter``; docs/heterps.md).
        heter_device: where they run it (``--heter-device``: ``cpu``, ``cuda``, ``auto``).
        log_dir: per-role logs (default ``MODEL_DIR/log``).
        job_id: id of the job's processes (default: the launcher's).
        rpc_timeout_s, collective_timeout_s, prefetch, push_queue_size: the
            :class:`sparseps.Strategy` knobs ``rpc_timeout``, ``collective_timeout``,
            ``prefetch``, ``push_queue_size``, with its defaults (unset: ``rpc_timeout``
            the client's, ``SPARSEPS_RPC_TIMEOUT`` or 60 s; ``collective_timeout`` 600 s);
            :attr:`strategy` is built from them and ``mode`` by
            :meth:`sparseps.Strategy.from_dict`.
        backend: ``local`` (the processes start on this machine) or ``ray`` (``sparseps
            launch --backend ray``: Ray places and starts them on its cluster,
            docs/cluster.md).
        ray_address: the Ray cluster (``--address``; default ``RAY_ADDRESS``, a running
            local cluster, or a new one). ``backend: ray`` only.
        server_resources, worker_resources: each server's / worker's Ray resources, a
            mapping such as ``{CPU: 2, GPU: 1}`` (``--server-resources`` /
            ``--worker-resources``; default ``{CPU: 1}``). ``backend: ray`` only.
        launch: the launcher's other settings, by :class:`sparseps.launch.config.LaunchConfig`
            field (``{max_restarts: 2, replicas: 1, file_roots: [/data]}``), read with
            the ones above by :meth:`LaunchConfig.from_dict
            <sparseps.launch.config.LaunchConfig.from_dict>`; a field this section sets
            itself is refused there.
    """

    server_num: int = 1
    worker_num: int = 1
    mode: str | dict = "sync"
    heter_worker_num: int = 0
    heter_device: str | None = None
    log_dir: str | None = None
    job_id: str | None = None
    # the Strategy's knobs, with its defaults (read from it: one set of defaults)
    rpc_timeout_s: float | None = _LIBRARY.rpc_timeout
    collective_timeout_s: float = _LIBRARY.collective_timeout
    prefetch: bool = _LIBRARY.prefetch
    push_queue_size: int = _LIBRARY.push_queue_size
    backend: str = "local"
    ray_address: str | None = None
    server_resources: dict | None = None
    worker_resources: dict | None = None
    launch: dict | None = None

    def __post_init__(self) -> None:
        check_int("job.server_num", self.server_num, 1, 64)
        check_int("job.worker_num", self.worker_num, 1, 64)
        mode = self.training_mode  # checks the name and the knobs
        check_int("job.heter_worker_num", self.heter_worker_num, 0, 64)
        if mode.dense_on_heter_workers and not self.heter_worker_num:
            raise ConfigError(f"job.mode {mode.name}: needs heter workers (job.heter_worker_num)")
        if self.heter_worker_num and not mode.dense_on_heter_workers:
            raise ConfigError(
                f"job.heter_worker_num: heter workers run the dense network of mode heter, "
                f"not of {mode.name} (set job.mode: heter, or job.heter_worker_num: 0)"
            )
        if self.heter_device is not None:
            check_choice("job.heter_device", self.heter_device, ("cpu", "cuda", "auto"))
            if not self.heter_worker_num:
                raise ConfigError("job.heter_device: the job has no heter workers")
        if self.log_dir is not None:
            check_str("job.log_dir", self.log_dir)
        if self.job_id is not None:
            check_str("job.job_id", self.job_id)
        for key in ("rpc_timeout_s", "collective_timeout_s"):
            if getattr(self, key) is not None:
                check_float(f"job.{key}", getattr(self, key), 0.0, open_lo=True)
        self.strategy  # noqa: B018 - checks the Strategy's knobs (with the mode's)
        check_choice("job.backend", self.backend, ("local", "ray"))
        for key in ("ray_address", "server_resources", "worker_resources"):
            if getattr(self, key) is not None and self.backend != "ray":
                raise ConfigError(f"job.{key}: applies only to job.backend: ray (the backend "
                                  f"is {self.backend!r})")  # fmt: skip
        if self.ray_address is not None:
            check_str("job.ray_address", self.ray_address)
        if self.launch is not None:
            self._check_launch(self.launch)
        for key in ("server_resources", "worker_resources"):
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, check_resources(f"job.{key}", value))

    def _check_launch(self, launch: object) -> None:
        from ..launch.config import LaunchConfig

        if not isinstance(launch, dict):
            raise ConfigError(f"job.launch: expected a mapping, got {launch!r}")
        if taken := sorted(set(launch) & _SET_BY_JOB):
            raise ConfigError(f"job.launch: {', '.join(taken)} set by the job section itself "
                              "(job.server_num, job.log_dir, ...); drop them here")  # fmt: skip
        LaunchConfig.from_dict({"script": "job.py", **launch}, where="job.launch")  # checks

    @property
    def strategy(self) -> Strategy:
        """The :class:`sparseps.Strategy` of this section (:meth:`Strategy.from_dict`)."""
        given = {
            "mode": self.mode, "rpc_timeout": self.rpc_timeout_s,
            "collective_timeout": self.collective_timeout_s, "prefetch": self.prefetch,
            "push_queue_size": self.push_queue_size,
        }  # fmt: skip
        try:
            return Strategy.from_dict(given, where="job")
        except ConfigError as exc:  # name the YAML's keys
            text = str(exc).replace("Strategy.rpc_timeout", "job.rpc_timeout_s")
            text = text.replace("Strategy.collective_timeout", "job.collective_timeout_s")
            raise ConfigError(text.replace("Strategy.", "job.")) from None

    @property
    def training_mode(self) -> Mode:
        """The :class:`~sparseps.Mode` of ``mode`` (its knobs checked)."""
        return mode_from_config(self.mode)

    @property
    def mode_name(self) -> str:
        return self.training_mode.name
