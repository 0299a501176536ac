"""Test helpers shipped with the package: local clusters, fault injection, planted data."""

from __future__ import annotations

from .cluster import LocalCluster, local_cluster
from .planted import planted_batches

__all__ = ["LocalCluster", "local_cluster", "planted_batches"]
