"""Checkpoints of an elastic job stay loadable into any server count, and bad elastic
messages never kill a server.

A save made after rows moved (placement != ``server_of``) is marked (``placement_version``
in each shard file's meta): a plain job of the same server count then filters it key by
key instead of trusting the file's rank, and an elastic job places it by its placement.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.config import TableConfig
from sparseps.core.placement import Placement, rebalance
from sparseps.core.routing import server_of
from sparseps.elastic import ElasticClient, install_placement, scale
from sparseps.elastic.peers import Peers
from sparseps.errors import InputError, RemoteError, SparsePSError
from sparseps.optim import Adagrad
from sparseps.server.handlers import ServerState
from sparseps.testing import local_cluster

KEYS = np.arange(1, 3001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
CONFIG = TableConfig(name="emb", dim=4, rule=Adagrad(lr=0.1))
VSHARDS = 96


def test_a_plain_server_filters_an_elastic_save_key_by_key():
    server = ServerState(1, 3, "127.0.0.1:1")
    plain = {"num_servers": 3, "rank": 1}
    # a plain save of this layout: the whole file
    assert server.ownership.owned_rows(plain, KEYS) is None
    assert server.ownership.owned_rows({"num_servers": 3, "rank": 0}, KEYS).size == 0
    elastic = {**plain, "placement_version": 2}
    np.testing.assert_array_equal(
        server.ownership.owned_rows(elastic, KEYS), np.flatnonzero(server_of(KEYS, 3) == 1)
    )
    endpoints = ["h:0", "h:1", "h:2"]
    moved = rebalance(Placement.default(endpoints, VSHARDS, ranks=[0, 1]), [0, 1, 2])
    server.elastic.install(moved)  # an elastic server: its placement decides
    np.testing.assert_array_equal(
        server.ownership.owned_rows(plain, KEYS), np.flatnonzero(moved.owner_of(KEYS) == 1)
    )


def _bad_messages(peers: Peers, endpoints: list[str]) -> None:
    """Each is refused with an error; the servers answer ping afterwards."""
    e0 = endpoints[0]
    with pytest.raises(InputError, match="hold no placement"):
        ElasticClient(endpoints)
    with pytest.raises(RemoteError, match="needs a placement"):
        peers.call(e0, "move_begin", None, [np.arange(3)])
    with pytest.raises(RemoteError, match="not a rank"):
        peers.call(e0, "set_placement", None, [np.array([0, 7])],
                   {"version": 1, "endpoints": endpoints})  # fmt: skip
    install_placement(peers, Placement.default(endpoints, VSHARDS, ranks=[0, 1]))
    with pytest.raises(RemoteError, match=f"0..{VSHARDS - 1}"):
        peers.call(e0, "move_freeze", None, [np.array([VSHARDS])])
    with pytest.raises(RemoteError, match="virtual shards"):  # V is fixed per job
        peers.call(e0, "set_placement", None, [np.zeros(16, np.int64)],
                   {"version": 2, "endpoints": endpoints})  # fmt: skip
    for endpoint in endpoints:
        peers.client(endpoint).create_table(CONFIG)
    with pytest.raises(RemoteError, match="still this server's"):
        peers.call(e0, "move_drop", "emb", [np.array([0])])
    with pytest.raises(SparsePSError):  # wrong dtype: refused at the frame boundary
        peers.call(e0, "move_begin", None, [np.array([0.5])])
    with pytest.raises(SparsePSError):  # too few buffers
        peers.call(e0, "move_import", "emb", [np.arange(2, dtype=np.uint64)])
    # a client of the old routing is refused by the placement, nothing applied
    with pytest.raises(RemoteError, match="placement version"):
        peers.client(endpoints[2]).push("emb", KEYS[:50], np.ones((50, 4), np.float32)).wait()
    for endpoint in endpoints:
        assert peers.call(endpoint, "ping")[0]["pid"] > 0


def test_elastic_save_reloads_after_a_shrink_and_bad_messages_are_refused(tmp_path):
    grads = np.random.default_rng(0).standard_normal((len(KEYS), 4)).astype(np.float32)
    with local_cluster(servers=3, timeout=30) as cluster:
        endpoints = list(cluster.endpoints)
        peers = Peers(timeout=30)
        try:
            _bad_messages(peers, endpoints)
            with ElasticClient(endpoints) as client:
                client.push("emb", KEYS, grads).wait()
                scale(
                    peers, endpoints, [0, 1, 2]
                )  # rows now where server_of(k, 3) does not put them
                client.push("emb", KEYS[::2], grads[::2]).wait()
                want = client.pull("emb", KEYS).wait()
                files = [r for e in endpoints for r in peers.client(e).save("emb", str(tmp_path))]
                client.push("emb", KEYS, grads).wait()  # changes the load must undo
                scale(peers, endpoints, [0, 1])  # back into this job, now on 2 servers
                loaded = sum(peers.client(e).load("emb", files)["rows"] for e in endpoints)
                assert loaded == len(KEYS)
                np.testing.assert_array_equal(client.pull("emb", KEYS).wait(), want)
                # the whole-row ops and push_delta route by placement too
                rows = client.pull_full("emb", KEYS).wait() + np.float32(1)
                client.write_rows("emb", KEYS, rows).wait()
                np.testing.assert_array_equal(client.pull_full("emb", KEYS).wait(), rows)
                client.push_delta("emb", KEYS, np.ones((len(KEYS), 4), np.float32)).wait()
                np.testing.assert_array_equal(client.pull("emb", KEYS).wait(), rows[:, :4] + 1)
        finally:
            peers.close()
