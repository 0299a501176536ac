"""The launcher: who runs where (``spec``), keeping processes alive or failing fast
(``supervisor``), the ``sparseps launch`` command (``cli``), and the worker rendezvous
and local-mode server that :mod:`sparseps.role` builds on.

Nothing here starts at import time; heavy modules (torch) are imported inside functions.
"""

from __future__ import annotations

from .spec import DEFAULT_MASTER_PORT, ClusterSpec, free_ports, make_spec
from .supervisor import ChildSpec, Failure, Outcome, Supervisor, SupervisorConfig

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
]
