"""The CTR accessor through real servers (issue 54): split rows equal the numpy oracle bit
for bit, in memory and on the disk tier; the delta and base inference filters and the
delta reset equal the oracle's; checkpoints reload both parts; with replicas every copy
holds the same rows, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Accessor, Initializer, Lifecycle, TableConfig
from sparseps.core.replicas import chain
from sparseps.core.routing import server_of
from sparseps.files import shards
from sparseps.testing import local_cluster
from sparseps.testing.ctr_reference import CtrReference

pytestmark = pytest.mark.timeout(240)

DIM = 5


def _config(dtype: str = "float16", memory_rows=None) -> TableConfig:
    return TableConfig(
        name="ctr", dim=DIM, rule=optim.SparseAdagrad(lr=0.1),
        initializer=Initializer.uniform(-0.1, 0.1), seed=11,
        lifecycle=Lifecycle(shrink_score=0.15, shrink_unseen_days=3, base_score=0.3),
        memory_rows=memory_rows,
        accessor=Accessor(embed_dim=1, embed_rule=optim.SparseAdagrad(lr=0.05),
                          embedx_threshold=0.6, embedx_dtype=dtype, cvm=True,
                          delta_threshold=0.25, delta_keep_days=1),
    )  # fmt: skip


def _batch(rng, keys: int = 400, size: int = 300):
    k = ((rng.pareto(0.8, size) * 5).astype(np.int64) % keys).astype(np.uint64)
    k = k * np.uint64(0x9E3779B97F4A7C15)  # spread over both servers
    return (
        k,
        rng.normal(0, 1, (size, DIM)).astype(np.float32),
        (rng.random(size) < 0.1).astype(np.float32),
    )


def _saved_keys(records) -> set[int]:
    keys = set()
    for record in records:
        _, columns = shards.read_shard(record["path"])
        keys |= {int(k) for k in columns["key"]}
    return keys


def test_split_rows_through_servers_equal_the_oracle_in_memory_and_on_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    config = _config()
    ref = CtrReference(config)
    rng = np.random.default_rng(1)
    names = ("ctr", "ctr_tier")
    with local_cluster(servers=2, environ={"SPARSEPS_DISK_DIR": str(disk)}) as cluster:
        client = cluster.client()
        client.create_table(config)
        client.create_table(dataclasses.replace(config, name="ctr_tier", memory_rows=12))
        probe = (np.arange(420, dtype=np.uint64)) * np.uint64(0x9E3779B97F4A7C15)
        for step in range(16):
            keys, grads, clicks = _batch(rng)
            for name in names:
                client.push(name, keys, grads, clicks=clicks).wait()
            ref.push(keys, grads, clicks=clicks)
            want = ref.pull(probe)
            for name in names:
                np.testing.assert_array_equal(client.pull(name, probe).wait(), want,
                                              err_msg=f"{name}, push {step}")  # fmt: skip
            if step in (5, 10):  # the end of a day
                for name in names:
                    client.decay(name, 0.5)
                ref.decay(0.5)
                deleted = ref.shrink()
                for name in names:
                    assert sorted(client.shrink(name).tolist()) == deleted
        stats = [s["tables"] for s in client.stats()["servers"]]
        assert sum(t["ctr"]["embedx_rows"] for t in stats) == len(ref.has_embedx())
        assert sum(t["ctr_tier"]["disk_reads"] for t in stats) > 0
        # inference saves: base keeps score >= base_threshold; delta also delta_score >=
        # delta_threshold, seen within delta_keep_days; the commit resets what delta saved
        for round_ in range(2):
            for name in names:
                base = client.save_inference(name, tmp_path / f"b{round_}" / name, "base")
                delta = client.save_inference(name, tmp_path / f"d{round_}" / name, "delta")
                assert _saved_keys(base) == ref.base_keep()
                assert _saved_keys(delta) == ref.delta_keep() != set()
                client.commit_inference(name)
            ref.reset_delta()
            keys, grads, clicks = _batch(rng)
            for name in names:
                client.push(name, keys, grads, clicks=clicks).wait()
            ref.push(keys, grads, clicks=clicks)
        # a checkpoint reloads both parts, bit for bit (in memory and tiered alike)
        pulled = {name: client.pull(name, probe).wait() for name in names}
        records = {name: client.save(name, tmp_path / "ckpt" / name) for name in names}
        for name in names:
            keys, grads, clicks = _batch(rng)
            client.push(name, keys, grads, clicks=clicks).wait()
            client.load(name, records[name])
            np.testing.assert_array_equal(client.pull(name, probe).wait(), pulled[name])


def test_replicated_split_copies_are_bit_identical():
    config = _config("float32")
    ref = CtrReference(config)
    rng = np.random.default_rng(2)
    servers, replicas = 2, 1
    with local_cluster(servers=servers, replicas=replicas) as cluster:
        client = cluster.client()
        client.create_table(config)
        for _ in range(8):
            keys, grads, clicks = _batch(rng)
            client.push("ctr", keys, grads, clicks=clicks).wait()
            ref.push(keys, grads, clicks=clicks)
        pool = np.array(sorted(ref.rows), np.uint64)
        owner = server_of(pool, servers)
        for shard in range(servers):
            keys = pool[owner == shard]
            copies = []
            for rank in chain(shard, servers, replicas):
                _, bufs = client.request(rank, "pull_full", "ctr", [keys],
                                         shard=None if rank == shard else shard).wait()  # fmt: skip
                copies.append(bufs[0])
            assert len(copies) == 2
            np.testing.assert_array_equal(copies[1], copies[0])  # both parts, both states
            np.testing.assert_array_equal(copies[0][:, :DIM], ref.pull(keys)[:, 2:])
