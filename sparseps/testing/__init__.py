"""Test helpers shipped with the package: local clusters and fault injection."""

from __future__ import annotations

from .cluster import LocalCluster, local_cluster

__all__ = ["LocalCluster", "local_cluster"]
