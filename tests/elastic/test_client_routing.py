"""A plain ``PSClient`` (a launched trainer's) follows a job that turns elastic (issue 23):
the part of a call a server refuses for a placement reason is resent to the new owner
(nothing lost, nothing doubled: rows equal an in-process oracle), new servers are learned
from the placement, table-wide ops reach the live servers only (a drained, stopped server
is not contacted), and a shard that stays frozen fails the call with a DeadlineError
naming the setting."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sparseps.config import TableConfig
from sparseps.core.placement import Placement
from sparseps.elastic import install_placement, scale
from sparseps.elastic.peers import Peers
from sparseps.errors import DeadlineError
from sparseps.optim import Adagrad
from sparseps.rpc.client import PSClient
from sparseps.table import SparseTable
from sparseps.testing import local_cluster

DIM = 4
VSHARDS = 96
KEYS = np.arange(1, 3001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
THIRD = np.ascontiguousarray(KEYS[::3])


def _config() -> TableConfig:
    return TableConfig(name="emb", dim=DIM, rule=Adagrad(lr=0.1))


def _grads(step: int, n: int) -> np.ndarray:
    return np.random.default_rng(step).standard_normal((n, DIM)).astype(np.float32)


def test_a_plain_client_follows_the_placement_and_skips_drained_servers(tmp_path):
    oracle = SparseTable(_config())
    with local_cluster(servers=3, timeout=30) as cluster:
        endpoints = list(cluster.endpoints)
        peers = Peers(timeout=30)
        try:
            # the job as launched: 2 servers; the default placement routes as server_of(k, 2)
            install_placement(peers, Placement.default(endpoints[:2], VSHARDS))
            with PSClient(endpoints[:2], timeout=10) as setup:
                setup.create_table(_config())  # a table-wide op: it asks for the placement
                assert setup.placement is not None and setup.placement.version == 1
            # the trainer's client; its 30 s timeout is what a wait on the stopped server
            # below would cost (the bounds there leave room for a loaded box)
            with PSClient(endpoints[:2], timeout=30) as client:
                client.push("emb", KEYS, _grads(0, len(KEYS))).wait()
                oracle.push(KEYS, _grads(0, len(KEYS)))
                assert client.placement is None  # nothing refused: the plain path
                scale(peers, endpoints, [0, 1, 2])  # a third of the shards move to server 2
                handle = client.push("emb", KEYS, _grads(1, len(KEYS)))
                handle.wait()
                oracle.push(KEYS, _grads(1, len(KEYS)))
                assert client.placement is not None and client.placement.version == 2
                assert client.refreshes >= 1
                assert len(client._channel.endpoints) == 3  # learned from the placement
                np.testing.assert_array_equal(client.pull("emb", KEYS).wait(), oracle.pull(KEYS))
                full = client.pull_full("emb", KEYS).wait()
                np.testing.assert_array_equal(full[:, :DIM], oracle.pull(KEYS))
                assert client.prefetch("emb", KEYS).wait() >= 0
                # the new server holds rows and counts in stats and saves
                assert client.stats()["total"]["tables"]["emb"]["rows"] == len(KEYS)
                saved = client.save("emb", tmp_path / "grown")
                assert sorted({r["rank"] for r in saved}) == [0, 1, 2]

                scale(peers, endpoints, [0, 1])  # drain server 2 and stop it
                peers.call(endpoints[2], "stop")
                cluster.processes[2].wait(30)
                # this client missed the drain (no refusal seen): its part for server 2
                # waits until the dropped connection shows (~0.5 s), then it learns the
                # placement and resends - within a third of its 30 s timeout
                start = time.monotonic()
                client.push("emb", THIRD, _grads(2, len(THIRD))).wait(timeout=10.0)
                print(f"\nfirst push after a missed drain: {time.monotonic() - start:.2f} s")
                assert client.placement.version == 3
                oracle.push(THIRD, _grads(2, len(THIRD)))
                start = time.monotonic()
                saved = client.save("emb", tmp_path / "shrunk")  # not sent to server 2
                client.decay("emb")
                oracle.decay()
                assert client.stats()["total"]["tables"]["emb"]["rows"] == len(KEYS)
                assert sorted({r["rank"] for r in saved}) == [0, 1]
                assert [a["rank"] for a in client.ping()] == [0, 1]
                assert time.monotonic() - start < 15.0  # no 30 s wait on the stopped server
                np.testing.assert_array_equal(client.pull("emb", KEYS).wait(), oracle.pull(KEYS))
        finally:
            peers.close()


def test_a_shard_that_stays_frozen_fails_with_the_setting_named():
    with local_cluster(servers=2, timeout=30) as cluster:
        endpoints = list(cluster.endpoints)
        peers = Peers(timeout=30)
        try:
            install_placement(peers, Placement.default(endpoints, VSHARDS))
            with PSClient(endpoints, timeout=10, placement_retry_s=0.3) as client:
                client.create_table(_config())
                peers.call(endpoints[0], "move_begin", None, [np.arange(VSHARDS // 2)])
                peers.call(endpoints[0], "move_freeze", None, [np.arange(VSHARDS // 2)])
                start = time.monotonic()
                with pytest.raises(DeadlineError, match="placement_retry_s") as info:
                    client.push("emb", KEYS, _grads(0, len(KEYS))).wait()
                assert info.value.setting == "PSClient(placement_retry_s=...)"
                # the 0.3 s limit, not the 60 s default (room for a loaded box)
                assert time.monotonic() - start < 15.0
        finally:
            peers.close()
