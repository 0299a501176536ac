"""Test helpers shipped with the package: local clusters, ranks run as processes, a fake
clock, waiting on a condition, fault injection, planted data, launched jobs."""

from __future__ import annotations

from .clock import FakeClock
from .cluster import LocalCluster, local_cluster
from .planted import planted_batches
from .ranks import RankResult, run_ranks
from .wait import wait_until

__all__ = [
    "FakeClock",
    "LocalCluster",
    "RankResult",
    "local_cluster",
    "planted_batches",
    "run_ranks",
    "wait_until",
]
