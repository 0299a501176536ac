"""The ``job`` section of an online config: the processes, the training mode and where
they run (this machine, or a Ray cluster with per-role resources).

One of the sections :class:`sparseps.online.config.OnlineConfig` is made of; each
section is its own frozen dataclass, validated at construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .config_values import check_choice, check_float, check_int, check_resources, check_str

__all__ = ["JobConfig"]


@dataclass(frozen=True)
class JobConfig:
    """Processes and training mode.

    Args:
        server_num, worker_num: processes the launcher starts (1..64).
        mode: ``sync`` (exact, reproducible), ``async`` or ``geo``.
        log_dir: per-role logs (default ``MODEL_DIR/log``).
        job_id: id of the job's processes (default: the launcher's).
        rpc_timeout_s, collective_timeout_s: see :class:`sparseps.Strategy`.
        backend: ``local`` (the processes start on this machine) or ``ray`` (``sparseps
            launch --backend ray``: Ray places and starts them on its cluster,
            docs/cluster.md).
        ray_address: the Ray cluster (``--address``; default ``RAY_ADDRESS``, a running
            local cluster, or a new one). ``backend: ray`` only.
        server_resources, worker_resources: each server's / worker's Ray resources, a
            mapping such as ``{CPU: 2, GPU: 1}`` (``--server-resources`` /
            ``--worker-resources``; default ``{CPU: 1}``). ``backend: ray`` only.
    """

    server_num: int = 1
    worker_num: int = 1
    mode: str = "sync"
    log_dir: str | None = None
    job_id: str | None = None
    rpc_timeout_s: float = 120.0
    collective_timeout_s: float = 3600.0
    backend: str = "local"
    ray_address: str | None = None
    server_resources: dict | None = None
    worker_resources: dict | None = None

    def __post_init__(self) -> None:
        check_int("job.server_num", self.server_num, 1, 64)
        check_int("job.worker_num", self.worker_num, 1, 64)
        check_choice("job.mode", self.mode, ("sync", "async", "geo"))
        if self.log_dir is not None:
            check_str("job.log_dir", self.log_dir)
        if self.job_id is not None:
            check_str("job.job_id", self.job_id)
        check_float("job.rpc_timeout_s", self.rpc_timeout_s, 0.0, open_lo=True)
        check_float("job.collective_timeout_s", self.collective_timeout_s, 0.0, open_lo=True)
        check_choice("job.backend", self.backend, ("local", "ray"))
        for key in ("ray_address", "server_resources", "worker_resources"):
            if getattr(self, key) is not None and self.backend != "ray":
                raise ConfigError(f"job.{key}: applies only to job.backend: ray (the backend "
                                  f"is {self.backend!r})")  # fmt: skip
        if self.ray_address is not None:
            check_str("job.ray_address", self.ray_address)
        for key in ("server_resources", "worker_resources"):
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, check_resources(f"job.{key}", value))
