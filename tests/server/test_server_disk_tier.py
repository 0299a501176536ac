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
from sparseps.rpc.protocol import Request
from sparseps.server import handlers
from sparseps.server.disk_dir import DiskDir
from sparseps.server.handlers import ServerState
from sparseps.server.heap import return_large_frees
from sparseps.table import SparseTable
from sparseps.testing import local_cluster, wait_until

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
        probe = rng.integers(0, 2100, 300).astype(np.uint64)
        for step in range(30):
            keys = rng.integers(0, 2000, 200).astype(np.uint64)
            grads = rng.normal(0, 1, (200, DIM)).astype(np.float32)
            # the server's prefetch thread promotes the probe's rows while this pushes
            assert client.prefetch("emb", probe).wait() == np.unique(probe).size
            assert client.prefetch("ref", probe).wait() == 0  # in memory: nothing to do
            client.push("emb", keys, grads).wait()
            client.push("ref", keys, grads).wait()
            oracle.push(keys, grads)
            np.testing.assert_array_equal(client.pull("emb", probe).wait(), oracle.pull(probe))
            probe = rng.integers(0, 2100, 300).astype(np.uint64)
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
        assert sum(s["prefetch"]["requests"] for s in servers) == 60
        assert sum(s["prefetch"]["failed"] for s in servers) == 0

        # rows promoted by a prefetch are pulled without reading the disk
        client.pull("emb", np.sort(oracle.keys())[-300:]).wait()  # evicts most others
        wanted = np.sort(oracle.keys())[:14]  # fits the budget of 16
        client.prefetch("emb", wanted).wait()
        servers: list[dict] = []

        def prefetched() -> bool:  # every prefetch request each server took is finished
            servers[:] = client.stats()["servers"]
            return all(
                s["prefetch"]["done"] + s["prefetch"]["dropped"] == s["prefetch"]["requests"]
                for s in servers
            )

        # 14 rows take the prefetch thread well under a second (this waited for a count
        # no server reaches, 61 per server: the loop ran out its 10 s on every run)
        wait_until(prefetched, 10, "the prefetches to finish", interval=0.05)
        assert sum(s["prefetch"]["rows"] for s in servers) > 0
        reads = sum(s["tables"]["emb"]["disk_reads"] for s in servers)
        np.testing.assert_array_equal(client.pull("emb", wanted).wait(), oracle.pull(wanted))
        servers = client.stats()["servers"]
        assert sum(s["tables"]["emb"]["disk_reads"] for s in servers) == reads

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


def test_a_server_with_a_disk_dir_returns_large_frees_to_the_system(tmp_path, monkeypatch):
    """Its budget is a promise: malloc's mmap threshold is fixed (bench tier measures the
    RSS it saves); the call works on this machine's C library."""
    calls = []
    monkeypatch.setattr(handlers, "return_large_frees", lambda: calls.append(1) or True)
    ServerState(0, 1, "here", disk_dir=str(tmp_path)).close()
    ServerState(0, 1, "here").close()
    assert calls == [1]
    assert return_large_frees() is True


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


def _request(op: str, table: str, **args) -> Request:
    return Request(op=op, id=1, table=table, bufs={}, args=args)


def test_a_tiered_table_is_saved_in_parts_and_loads_back(tmp_path):
    """The save streams a table larger than memory in parts (here ~40 rows each); the
    parts load into a tiered and an in-memory table alike."""
    disk = tmp_path / "disk"
    disk.mkdir()
    state = ServerState(0, 1, "127.0.0.1:1", disk_dir=str(disk))
    state.files.save_part_bytes = 40 * 4 * SparseTable(_config()).layout.width
    try:
        state.handle(_request("create_table", "emb", config=_config(memory_rows=16).to_dict()))
        ref = dataclasses.replace(_config(), name="ref")
        state.handle(_request("create_table", "ref", config=ref.to_dict()))
        keys = np.arange(1000, dtype=np.uint64)
        grads = np.random.default_rng(1).normal(0, 1, (1000, DIM)).astype(np.float32)
        for name in ("emb", "ref"):
            table = state.sparse[name].table
            for at in range(0, 1000, 10):  # twice per key: count admission makes rows
                table.push(keys[at : at + 10], grads[at : at + 10])
                table.push(keys[at : at + 10], grads[at : at + 10])
        records, _ = state.handle(_request("save", "emb", directory=str(tmp_path / "ck")))
        rows = [r for r in records if r["kind"] == "rows"]
        assert len(rows) == 25 and sum(r["rows"] for r in rows) == 1000
        assert len({r["name"] for r in records}) == len(records) == 26
        for target in ("emb", "ref"):
            if target == "emb":  # replace what it holds
                state.sparse["emb"].table.push(keys, np.ones((1000, DIM), np.float32))
            loaded, _ = state.handle(_request("load", target, files=records))
            assert loaded["rows"] == 1000
        for mode in ("base", "delta"):  # inference saves read the parts too
            got, _ = state.handle(_request("save_inference", "emb", mode=mode,
                                           directory=str(tmp_path / "i" / "emb")))  # fmt: skip
            want, _ = state.handle(_request("save_inference", "ref", mode=mode,
                                            directory=str(tmp_path / "i" / "ref")))  # fmt: skip
            _, a = shards.read_shard(got["path"])
            _, b = shards.read_shard(want["path"])
            assert a["key"].size == 1000
            for name in ("key", "embedding"):
                np.testing.assert_array_equal(a[name], b[name])
        expected = state.sparse["ref"].table.export_rows()
        got = state.sparse["emb"].table.export_rows()
        order_a, order_b = np.argsort(expected["key"]), np.argsort(got["key"])
        for name in expected:
            np.testing.assert_array_equal(got[name][order_b], expected[name][order_a], name)
    finally:
        state.close()
