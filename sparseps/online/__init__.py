"""Streaming (online) training in passes over time-partitioned data (docs/online.md).

``sparseps online CONFIG.yaml`` runs a job; :class:`OnlineDriver` is its pass loop,
:class:`Ledger` its record of completed passes (:class:`LedgerError`: a ledger that
cannot be read), :func:`load_config` its validated config, :func:`plan_pass` what each
pass saves, :class:`PhaseEvent` what its ``on_phase`` hook gets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import OnlineConfig, load_config
from .layout import DataLayout, PassId
from .ledger import Ledger, LedgerError
from .phases import PHASES, PhaseEvent
from .schedule import PassPlan, plan_pass

if TYPE_CHECKING:  # loaded when asked for (below)
    from .stream import write_stream

__all__ = [
    "PHASES",
    "DataLayout",
    "Ledger",
    "LedgerError",
    "OnlineConfig",
    "PassId",
    "PassPlan",
    "PhaseEvent",
    "load_config",
    "plan_pass",
    "write_stream",
]


def __getattr__(name: str) -> Any:
    # loaded only when asked for: the driver needs torch, the stream writer numba (~0.4
    # CPU-s), and `sparseps online` (the launcher of a job) needs neither
    if name == "OnlineDriver":
        from .driver import OnlineDriver

        return OnlineDriver
    if name == "write_stream":
        from .stream import write_stream

        return write_stream
    raise AttributeError(f"module 'sparseps.online' has no attribute {name!r}")
