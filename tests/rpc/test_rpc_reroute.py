"""Save on 2 servers, load on 3: every row (all export columns) survives bit-exactly."""

from __future__ import annotations

import numpy as np
import pyarrow.feather as feather
import pytest

from sparseps import optim
from sparseps.config import Lifecycle, TableConfig
from sparseps.errors import RemoteError
from sparseps.files.shards import read_shard
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(120)

CONFIG = TableConfig(
    name="emb",
    dim=6,
    rule=optim.Adam(lr=0.01),
    lifecycle=Lifecycle(admission="count", admit_count=2),
    seed=11,
)


def _columns(records: list[dict], kind: str) -> dict[str, np.ndarray]:
    """All rows of one kind from a save, sorted by key."""
    parts = [read_shard(r["path"], sha256=r["sha256"])[1] for r in records if r["kind"] == kind]
    merged = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    order = np.argsort(merged["key"])
    return {name: values[order] for name, values in merged.items()}


def _train(client) -> np.ndarray:
    rng = np.random.default_rng(5)
    for _ in range(6):
        keys = rng.integers(0, 4000, 2000).astype(np.uint64) * np.uint64(2654435761)
        grads = rng.standard_normal((2000, CONFIG.dim)).astype(np.float32)
        clicks = (rng.random(2000) < 0.2).astype(np.float32)
        client.push("emb", keys, grads, clicks=clicks).wait()
    client.decay("emb", 0.9)
    return keys


def test_two_servers_save_load_onto_three(tmp_path):
    with local_cluster(servers=2, timeout=30) as cluster, cluster.client(timeout=30) as client:
        client.create_table(CONFIG)
        probe = _train(client)
        before = client.pull("emb", probe).wait()
        saved = client.save("emb", tmp_path / "two")
    assert sorted(r["name"] for r in saved) == [
        "emb.pending-00000-of-00002.arrow",
        "emb.pending-00001-of-00002.arrow",
        "emb.shard-00000-of-00002.arrow",
        "emb.shard-00001-of-00002.arrow",
    ]
    schema = feather.read_table(
        saved[0]["path"] if saved[0]["kind"] == "rows" else saved[1]["path"]
    )
    assert str(schema.field("key").type) == "uint64"
    assert str(schema.field("embedding").type).startswith("fixed_size_list<")

    with local_cluster(servers=3, timeout=30) as cluster, cluster.client(timeout=30) as client:
        client.create_table(CONFIG)
        loaded = client.load("emb", saved)
        assert loaded["rows"] == sum(r["rows"] for r in saved if r["kind"] == "rows")
        assert loaded["pending"] == sum(r["rows"] for r in saved if r["kind"] == "pending") > 0
        np.testing.assert_array_equal(client.pull("emb", probe).wait(), before)
        per_server = [s["tables"]["emb"]["rows"] for s in client.stats()["servers"]]
        assert all(n > 0 for n in per_server)
        resaved = client.save("emb", tmp_path / "three")

        # A shard of another table's layout is refused, with the reason.
        client.create_table(TableConfig(name="other", dim=3, rule=optim.SGD()))
        with pytest.raises(RemoteError, match="dim"):
            client.load("other", saved)

    for kind in ("rows", "pending"):
        a, b = _columns(saved, kind), _columns(resaved, kind)
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype, name
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{kind}.{name}")
    assert {"key", "embedding", "state", "show", "click", "unseen_days", "delta_score"} <= set(
        _columns(saved, "rows")
    )


def test_load_verifies_checksums(tmp_path):
    with local_cluster(servers=1, timeout=30) as cluster, cluster.client(timeout=30) as client:
        client.create_table(CONFIG)
        _train(client)
        saved = client.save("emb", tmp_path)
        # the client forwards both checksums and the servers check xxh3-128 when given: a
        # wrong SHA-256 beside a right xxh3-128 loads, a wrong xxh3-128 does not
        assert all("xxh3_128" in r for r in saved)
        wrong_sha = [{**r, "sha256": "0" * 64} for r in saved]
        assert client.load("emb", wrong_sha)["rows"] == sum(
            r["rows"] for r in saved if r["kind"] == "rows"
        )
        with pytest.raises(RemoteError, match="xxh3_128 does not match"):
            client.load("emb", [{**r, "xxh3_128": "0" * 32} for r in saved])
        # a record saved before xxh3-128 was recorded is checked by its SHA-256
        old_style = [{k: v for k, v in r.items() if k != "xxh3_128"} for r in wrong_sha]
        with pytest.raises(RemoteError, match="sha256 does not match"):
            client.load("emb", old_style)
        with pytest.raises(RemoteError, match="does not exist"):
            client.load("emb", [str(tmp_path / "nope.arrow")])
