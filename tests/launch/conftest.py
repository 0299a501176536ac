"""The launcher tests' shared Ray cluster (:mod:`sparseps.testing.ray_cluster`): it starts
for the first test that asks for ``ray_cluster`` and stops as soon as the next test does
not ask for it (tests/conftest.py keeps the Ray files together on one xdist worker), so
the Ray files pay one cluster start, and nothing runs beside a test that is not theirs."""

from __future__ import annotations

import pytest

from sparseps.testing.ray_cluster import LocalRayCluster

_CLUSTER = LocalRayCluster()


@pytest.fixture
def ray_cluster() -> str:
    """The GCS address of a running two-node cluster (the head and ``node_b``)."""
    return _CLUSTER.start()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if "ray_cluster" in getattr(item, "fixturenames", ()) and (
        nextitem is None or "ray_cluster" not in getattr(nextitem, "fixturenames", ())
    ):
        _CLUSTER.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:  # noqa: ARG001 - the hook's
    _CLUSTER.stop()  # a run interrupted mid-way
