"""A replacement server copies its shards back while a client keeps pushing.

Three servers with ``replicas=1``; server 1 is killed, a replacement starts on its port
(``--recover``) and copies shard 1 (from server 2) and shard 0 (from server 0) while the
client keeps pushing (its writes meet the survivors' pause and epoch change). Then the
survivor server 2 is killed too: shard 1 now lives only on the replacement, so rows equal
to the oracle prove the copy was whole and every push during the copy reached it.
"""

from __future__ import annotations

import time

import numpy as np

from sparseps.config import TableConfig
from sparseps.optim import Adagrad
from sparseps.table import SparseTable
from sparseps.testing import local_cluster

DIM = 4
POOL = np.arange(1, 2001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


def _batch(step: int):
    rng = np.random.default_rng(1000 + step)
    keys = rng.choice(POOL, size=200)
    return keys, rng.standard_normal((len(keys), DIM)).astype(np.float32)


def test_replacement_copies_its_shards_while_pushes_go_on():
    config = TableConfig(name="emb", dim=DIM, rule=Adagrad(lr=0.1))
    oracle = SparseTable(config)
    step = 0

    def push(client) -> None:
        nonlocal step
        keys, grads = _batch(step)
        client.push("emb", keys, grads).wait()
        oracle.push(keys, grads)
        step += 1

    with local_cluster(servers=3, replicas=1, timeout=30) as cluster:
        client = cluster.client(timeout=30)
        client.create_table(config)
        for _ in range(10):
            push(client)
        cluster.kill(1)
        for _ in range(5):
            push(client)
        cluster.replace(1)
        deadline = time.monotonic() + 60
        while True:  # pushes go on while the replacement copies
            push(client)
            status = client.replica_status()
            ranks = [[c["rank"] for c in s["copies"]] for s in status]
            if ranks[1] == [1, 2] and ranks[0] == [0, 1]:
                break
            assert time.monotonic() < deadline, status
            # the client reconnects to the replacement on its next write's epoch refusal
        copies = {(s["shard"], c["rank"]): c for s in status for c in s["copies"]}
        # epoch 1: server 2 took shard 1 over (or dropped server 1); epoch 2: the
        # replacement joined the end of the chain, behind the survivor that stays head
        assert not copies[(1, 1)]["recovering"] and copies[(1, 1)]["epoch"] == 2
        assert copies[(1, 1)]["members"] == [2, 1] == copies[(1, 2)]["members"]
        assert copies[(1, 1)]["index"] == copies[(1, 2)]["index"]
        for _ in range(5):
            push(client)
        # a fresh client (it never saw the loss) reads the same rows, the replacement's
        fresh = cluster.client(timeout=30)
        np.testing.assert_array_equal(fresh.pull("emb", POOL).wait(), oracle.pull(POOL))
        fresh.close()
        cluster.kill(2)  # shard 1 is now only on the replacement, shard 2 on server 0
        for _ in range(5):
            push(client)
        np.testing.assert_array_equal(client.pull("emb", POOL).wait(), oracle.pull(POOL))
        assert "re-replicated shard 1 from server 2" in cluster.log_text(1)
