"""Spread reads (issue 59): with ``replicas=1`` a shard's pulls go to its live copies in
turn. They return exactly what reads at the head return (the copies are bit-identical
once a write is acknowledged), the backup copies do answer them, and they keep working
when a copy is killed (the read goes back to a live copy)."""

from __future__ import annotations

import numpy as np

from sparseps.config import TableConfig
from sparseps.core.routing import dense_server_of, server_of
from sparseps.optim import Adagrad
from sparseps.testing import local_cluster

DIM = 4
POOL = np.arange(1, 2001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


def _push_steps(client, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        rng = np.random.default_rng(step)
        keys = rng.choice(POOL, size=400)
        grads = rng.standard_normal((keys.size, DIM)).astype(np.float32)
        client.push("emb", keys, grads).wait()  # acknowledged: on every live copy


def _requests(client) -> dict[int, int]:
    """Requests each server process answered (its own shard and its backups)."""
    return {s["rank"]: s["requests"] for s in client.stats()["servers"]}


def test_spread_reads_equal_head_reads_and_reach_the_backups():
    dense = next(f"d{i}" for i in range(100) if dense_server_of(f"d{i}", 3) == 0)
    with local_cluster(servers=3, replicas=1, timeout=30) as cluster:
        spread = cluster.client(timeout=30)
        head_only = cluster.client(timeout=30)
        head_only.views.spread_reads = False
        assert spread.views.spread_reads
        spread.create_table(TableConfig(name="emb", dim=DIM, rule=Adagrad(lr=0.1)))
        spread.create_dense(dense, 8, Adagrad(lr=0.1))
        _push_steps(spread, 10)
        spread.push_dense(dense, np.full(8, 0.5, np.float32)).wait()
        expected = head_only.pull("emb", POOL).wait()
        expected_dense = head_only.pull_dense(dense).wait()
        # shard 0's keys only: its copies are on servers 0 (head) and 1
        shard0 = POOL[server_of(POOL, 3) == 0]
        before = _requests(head_only)
        for _ in range(6):
            np.testing.assert_array_equal(spread.pull("emb", POOL).wait(), expected)
            np.testing.assert_array_equal(spread.pull_dense(dense).wait(), expected_dense)
        for _ in range(4):
            spread.pull("emb", shard0).wait()
        after = _requests(head_only)
        # server 1 answered some of shard 0's reads (its backup copy); head-only reads of
        # shard 0 never reach it
        assert after[1] - before[1] > 6 + 2  # its own shard's 6 pulls, and shard 0's share
        before = _requests(head_only)
        for _ in range(4):
            head_only.pull("emb", shard0).wait()
        after = _requests(head_only)
        assert after[1] - before[1] <= 1  # at most the stats call itself


def test_spread_reads_keep_working_when_a_copy_is_killed():
    with local_cluster(servers=3, replicas=1, timeout=30) as cluster:
        client = cluster.client(timeout=30)
        reader = cluster.client(timeout=30)  # reads only: learns of the loss from its reads
        client.create_table(TableConfig(name="emb", dim=DIM, rule=Adagrad(lr=0.1)))
        _push_steps(client, 8)
        expected = client.pull("emb", POOL).wait()
        np.testing.assert_array_equal(reader.pull("emb", POOL).wait(), expected)
        cluster.kill(1)  # the head of shard 1 and the backup of shard 0
        for _ in range(6):  # each shard's reads take every live copy in turn
            np.testing.assert_array_equal(reader.pull("emb", POOL).wait(), expected)
        _push_steps(client, 4, start=100)  # writes go on; spread reads see them
        expected = client.pull("emb", POOL).wait()
        for _ in range(4):
            np.testing.assert_array_equal(reader.pull("emb", POOL).wait(), expected)
