"""Async mode's dense pull interval and geo mode's bounded local copy, on fake servers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import sparseps as sps
from sparseps.config import TableConfig
from sparseps.table import SparseTable
from sparseps.worker.dense_params import DenseParams
from sparseps.worker.geo_mode import GeoMode
from sparseps.worker.modes import AsyncMode


class _Done:
    def __init__(self, value=None):
        self.value = value

    def wait(self, timeout=None):
        return self.value


class FakeServers:
    """In-process stand-ins for the servers: sparse tables and one SGD dense table."""

    timeout = 5.0

    def __init__(self, lr: float = 0.5):
        self.lr = lr
        self.tables: dict[str, SparseTable] = {}
        self.dense: np.ndarray | None = None
        self.calls: list[tuple[str, int]] = []  # (op, number of keys)

    def create_table(self, config):
        self.tables[config.name] = SparseTable(config)

    def create_dense(self, name, size, rule, init=None):
        self.dense = np.array(init, np.float32)

    def pull_dense(self, name):
        self.calls.append(("pull_dense", 0))
        return _Done(self.dense.copy())  # the values when the pull is served

    def push_dense(self, name, grad, *, pull=False):
        self.dense -= self.lr * grad
        if pull:  # the values after this step come back with it
            self.calls.append(("push_dense_pull", 0))
            return _Done(self.dense.copy())
        return _Done()

    def push_dense_delta(self, name, delta):
        self.dense += delta
        return _Done()

    def pull(self, table, keys):
        self.calls.append(("pull", keys.size))
        return _Done(self.tables[table].pull(keys))

    def push(self, table, keys, grads, shows=None, clicks=None):
        self.tables[table].push(keys, grads, shows, clicks)
        return _Done()

    def push_delta(self, table, keys, deltas, shows=None, clicks=None):
        self.tables[table].push_delta(keys, deltas, shows, clicks)
        return _Done()


@pytest.mark.parametrize("interval", [1, 3])
def test_async_dense_values_refresh_every_interval_steps(interval):
    servers = FakeServers(lr=0.5)
    module = nn.Linear(1, 1, bias=False)
    nn.init.constant_(module.weight, 1.0)
    strategy = sps.Strategy(mode=sps.Async(dense_pull_interval=interval))
    mode = AsyncMode(
        servers, DenseParams(module), sps.optim.SGD(lr=0.5), strategy, rank=0, tables=[]
    )  # the constructor makes the state complete (creates and pulls the dense table)
    seen = []
    for _ in range(7):
        mode.before_forward()
        seen.append(float(mode.dense.values()[0]))
        mode.apply([], np.ones(1, np.float32))  # every push moves the server value by -0.5
    # before step s the worker sees the pushes up to the last multiple of the interval
    assert seen == [1.0 - 0.5 * (s // interval * interval) for s in range(7)]
    # the constructor pulls; then one pull per interval, riding on that step's push
    assert [c[0] for c in servers.calls] == ["pull_dense"] + ["push_dense_pull"] * (7 // interval)
    mode.finish_pass()  # a pass ends with the fresh values, whatever the interval
    assert float(mode.dense.values()[0]) == 1.0 - 0.5 * 7
    mode.close()


def _geo(keep):
    servers = FakeServers()
    config = TableConfig(name="t", dim=2, rule=sps.optim.SGD(lr=0.1))
    servers.create_table(config)
    strategy = sps.Strategy(mode=sps.Geo(k_steps=1, keep_windows=keep))
    mode = GeoMode(
        servers, DenseParams(nn.Module()), sps.optim.SGD(lr=0.1), strategy, rank=0,
        tables=[config],
    )  # fmt: skip
    return servers, mode


def _step(mode, keys):
    keys = np.asarray(keys, np.uint64)
    mode.pull_rows({"t": keys})
    grads = np.ones((keys.size, 2), np.float32)
    ones = np.ones(keys.size, np.float32)
    mode.apply([("t", keys, grads, ones, ones * 0)], np.zeros(0, np.float32))  # k_steps=1


@pytest.mark.parametrize("keep", [None, 2])
def test_geo_local_copy_drops_rows_unused_for_keep_windows(keep):
    servers, mode = _geo(keep)
    _step(mode, [1, 2])  # window 1
    _step(mode, [3])  # window 2: 1 and 2 unused once
    assert len(mode.local["t"]) == 3
    _step(mode, [3])  # window 3: 1 and 2 unused twice
    kept = mode.local["t"].contains(np.array([1, 2, 3], np.uint64)).tolist()
    assert kept == ([True, True, True] if keep is None else [False, False, True])
    assert len(mode.base["t"]) == len(mode.local["t"])  # base follows the local copy
    # a dropped row comes back from the servers, with every update it got there
    before = sum(n for op, n in servers.calls if op == "pull")
    rows = mode.pull_rows({"t": np.array([1], np.uint64)})["t"]
    fetched = sum(n for op, n in servers.calls if op == "pull") - before
    assert fetched == (0 if keep is None else 1)
    np.testing.assert_array_equal(rows, servers.tables["t"].pull(np.array([1], np.uint64)))


def test_geo_dense_deltas_are_averaged_over_workers():
    """Two geo workers that take the same local dense step from the same start leave the
    servers where one of them would: each pushes its delta over the number of workers.
    Summed, N workers made the step N times (the test AUC of the demo at 4% clicks fell
    to 0.55-0.75)."""
    servers = FakeServers()
    strategy = sps.Strategy(mode=sps.Geo(k_steps=1))
    workers = []
    for rank in range(2):
        module = nn.Linear(1, 1, bias=False)
        nn.init.constant_(module.weight, 1.0)
        workers.append(GeoMode(servers, DenseParams(module), sps.optim.SGD(lr=0.5), strategy,
                               rank=rank, tables=[]))  # fmt: skip
    for mode in workers:
        mode.workers = 2  # as if the two were one job's workers (this test has no group)
    for mode in workers:  # both step from 1.0 by -0.5 * 1.0 before either sync is seen
        mode.local_dense.push(np.ones(1, np.float32))
    for mode in workers:
        mode._sync()
    assert servers.dense.tolist() == [0.5]  # summed, it would be 0.0
    assert [float(m.dense.values()[0]) for m in workers] == [0.75, 0.5]  # the last refresh


@pytest.mark.parametrize("layers", [1, 2], ids=["one_parameter", "several"])
def test_dense_grads_are_a_copy_the_next_backward_does_not_touch(layers):
    # the trainer hands this array to an asynchronous push while the next step runs
    module = nn.Sequential(*[nn.Linear(2, 2, bias=layers > 1) for _ in range(layers)])
    params = DenseParams(module)
    module(torch.ones(1, 2)).sum().backward()
    grads = params.grads()
    before = grads.copy()
    for p in module.parameters():
        p.grad.add_(100.0)  # what accumulating into the same .grad would do
    params.zero_grad()
    module(torch.ones(1, 2)).sum().backward()
    np.testing.assert_array_equal(grads, before)
