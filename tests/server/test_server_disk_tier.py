"""Real server processes with a disk dir: a tiered table through PSClient equals an
in-process in-memory table; the disk dir is owned, cleaned and released by the server."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Lifecycle, TableConfig
from sparseps.errors import ConfigError, RemoteError
from sparseps.files import shards
from sparseps.server.disk_dir import DiskDir
from sparseps.table import SparseTable
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(180)

DIM = 4


def _config(memory_rows=None) -> TableConfig:
    return TableConfig(name="emb", dim=DIM, rule=optim.Adam(lr=0.01), seed=3,
                       lifecycle=Lifecycle(admission="count", admit_count=2, shrink_score=0.05),
                       memory_rows=memory_rows)  # fmt: skip


def _row_files(folder) -> list[str]:
    return sorted(
        name for _, _, files in os.walk(folder) for name in files if name.endswith(".rows")
    )


def test_tiered_table_on_servers_equals_an_in_memory_table(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    stale = disk / "server-00001"
    stale.mkdir()
    (stale / "emb.123.0.rows").write_bytes(b"left by a crashed server")
    (stale / "notes.txt").write_text("not ours: must stay")
    oracle = SparseTable(_config())
    rng = np.random.default_rng(5)
    with local_cluster(servers=2, environ={"SPARSEPS_DISK_DIR": str(disk)}) as cluster:
        assert not (stale / "emb.123.0.rows").exists() and (stale / "notes.txt").exists()
        client = cluster.client()
        client.create_table(_config(memory_rows=16))
        client.create_table(dataclasses.replace(_config(), name="ref"))  # in memory
        for step in range(30):
            keys = rng.integers(0, 2000, 200).astype(np.uint64)
            grads = rng.normal(0, 1, (200, DIM)).astype(np.float32)
            client.push("emb", keys, grads).wait()
            client.push("ref", keys, grads).wait()
            oracle.push(keys, grads)
            probe = rng.integers(0, 2100, 300).astype(np.uint64)
            np.testing.assert_array_equal(client.pull("emb", probe).wait(), oracle.pull(probe))
            if step % 10 == 9:
                client.decay("emb", 0.8)
                client.decay("ref", 0.8)
                oracle.decay(0.8)
                np.testing.assert_array_equal(client.shrink("emb"), oracle.shrink())
                client.shrink("ref")
            if step % 10 == 4:  # inference saves: base, then delta + commit (delta reset)
                for mode in ("base", "delta"):
                    got = client.save_inference("emb", tmp_path / f"i{step}" / "emb", mode)
                    want = client.save_inference("ref", tmp_path / f"i{step}" / "ref", mode)
                    for a, b in zip(got, want, strict=True):
                        _, cols_a = shards.read_shard(a["path"])
                        _, cols_b = shards.read_shard(b["path"])
                        for name in ("key", "embedding"):
                            np.testing.assert_array_equal(cols_a[name], cols_b[name])
                client.commit_inference("emb")
                client.commit_inference("ref")
        servers = client.stats()["servers"]
        tables = [server["tables"]["emb"] for server in servers]
        assert sum(t["rows"] for t in tables) == len(oracle)
        # memory holds max(memory_rows, the distinct rows of the largest request)
        assert all(t["memory_rows"] <= 200 and t["disk_rows"] > 300 for t in tables)
        assert len(_row_files(disk)) == 2  # one row file per server

        # a checkpoint of the tiered table holds exactly the in-memory table's rows
        records = client.save("emb", tmp_path / "ckpt")
        client.create_table(dataclasses.replace(_config(), name="copy"))
        client.load("copy", records)
        keys = np.sort(oracle.keys())
        saved = oracle.pull(keys)
        np.testing.assert_array_equal(client.pull("copy", keys).wait(), saved)
        # ... and loads back into the tiers, replacing what was pushed since
        client.push("emb", keys, np.ones((keys.size, DIM), np.float32)).wait()
        client.load("emb", records)
        np.testing.assert_array_equal(client.pull("emb", keys).wait(), saved)
        assert len(_row_files(disk)) == 2  # the replaced contents' files are gone
        client.close()
    assert _row_files(disk) == [], "a stopped server deletes its row files"


def test_memory_rows_without_a_disk_dir_is_refused_and_the_server_lives_on(tmp_path):
    with local_cluster(servers=1, environ={"SPARSEPS_DISK_DIR": ""}) as cluster:
        client = cluster.client()
        with pytest.raises(
            RemoteError, match=r"server 0: table 'emb' has memory_rows=16.*--disk-dir"
        ):
            client.create_table(_config(memory_rows=16))
        client.create_table(_config())  # the server is fine
        client.ping()
        client.close()


def test_a_disk_dir_belongs_to_one_live_server(tmp_path):
    owner = DiskDir(str(tmp_path), 0)
    try:
        with pytest.raises(ConfigError, match="in use by another live server"):
            DiskDir(str(tmp_path), 0)
        DiskDir(str(tmp_path), 1).close()  # another rank has its own folder
    finally:
        owner.close()
    DiskDir(str(tmp_path), 0).close()  # released at close
