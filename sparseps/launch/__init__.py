"""The launcher: what to launch (``config.LaunchConfig``), where it runs (the backends
behind ``launch_cli.launch``: local, Ray, Kubernetes), who runs where (``spec``), keeping
processes alive or failing fast (``supervisor``), fork servers, scaling. The job's key-value store is :mod:`sparseps.store`; the workers'
rendezvous, process group and local mode are :mod:`sparseps.runtime`.

Nothing here starts at import time; heavy modules (torch) are imported inside functions.
"""

from __future__ import annotations

import os

from .spec import DEFAULT_MASTER_PORT, ClusterSpec, free_ports, make_spec
from .supervisor import ChildSpec, Failure, Outcome, Supervisor, SupervisorConfig


def scale_job(
    log_dir: str | os.PathLike,
    *,
    servers: int | None = None,
    workers: int | None = None,
    timeout_s: float = 600.0,
) -> dict:
    """Resize a running launched job (``sparseps scale``): see
    :func:`sparseps.launch.scale_cli.scale_job`."""
    from .scale_cli import scale_job as scale

    return scale(log_dir, servers=servers, workers=workers, timeout_s=timeout_s)


__all__ = [
    "DEFAULT_MASTER_PORT",
    "ChildSpec",
    "ClusterSpec",
    "Failure",
    "Outcome",
    "Supervisor",
    "SupervisorConfig",
    "free_ports",
    "make_spec",
    "scale_job",
]
