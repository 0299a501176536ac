"""Test helpers shipped with the package: local clusters, ranks run as processes, a fake
clock, fault injection, planted data."""

from __future__ import annotations

from .clock import FakeClock
from .cluster import LocalCluster, local_cluster
from .planted import planted_batches
from .ranks import RankResult, run_ranks

__all__ = [
    "FakeClock",
    "LocalCluster",
    "RankResult",
    "local_cluster",
    "planted_batches",
    "run_ranks",
]
