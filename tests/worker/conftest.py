"""Shared helpers of the worker tests: planted batches and an in-process local-mode worker."""

from __future__ import annotations

import pytest

from sparseps.testing import planted_batches


@pytest.fixture
def local_worker():
    """This test process as worker 0 of 1 in local mode, with a fresh background server
    (a server holds one dense table per job, so each test gets its own)."""
    import sparseps as sps

    env = sps.init()
    assert env.local and env.worker_num == 1
    yield env
    sps.stop()


@pytest.fixture
def planted():
    """:func:`sparseps.testing.planted_batches` (a fixture, so test modules need not import
    conftest)."""
    return planted_batches
