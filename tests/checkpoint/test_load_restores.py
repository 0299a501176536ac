"""A load makes each table exactly the checkpoint, atomically per server.

Servers that trained past a checkpoint (new rows, new pending keys, further steps on old
rows) and then load it must end up identical to a fresh server that loaded it: same pull
results, same stats, same rows bit for bit, same behaviour on the next push. A load that
fails half-way (a corrupt second shard file) leaves the table bit-exactly as it was.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Lifecycle, TableConfig
from sparseps.errors import InputError, RemoteError
from sparseps.files.shards import read_shard
from sparseps.table import SparseTable
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(180)

CONFIG = TableConfig(
    name="emb", dim=4, rule=optim.Adagrad(lr=0.1),
    lifecycle=Lifecycle(admission="count", admit_count=2), seed=3,
)  # fmt: skip


def _batch(rng, low: int, high: int, n: int = 3000):
    keys = (rng.integers(low, high, n).astype(np.uint64) * np.uint64(2654435761)) + np.uint64(1)
    grads = rng.standard_normal((n, CONFIG.dim)).astype(np.float32)
    clicks = (rng.random(n) < 0.3).astype(np.float32)
    return keys, grads, clicks


def _sorted(columns: dict) -> dict:
    order = np.argsort(columns["key"])
    return {name: values[order] for name, values in columns.items()}


def _snapshot(table: SparseTable) -> dict:
    rows, pending = _sorted(table.export_rows()), _sorted(table.export_pending())
    return {**{f"rows.{k}": v for k, v in rows.items()},
            **{f"pending.{k}": v for k, v in pending.items()}}  # fmt: skip


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def test_restore_replaces_rows_and_pending_keys():
    rng = np.random.default_rng(0)
    table = SparseTable(CONFIG)
    for _ in range(3):
        keys, grads, clicks = _batch(rng, 0, 2000)
        table.push(keys, grads, clicks=clicks)
    saved_rows, saved_pending = table.export_rows(), table.export_pending()
    checkpoint = _snapshot(table)
    for _ in range(3):  # train on: old rows change, new rows and pending keys appear
        keys, grads, clicks = _batch(rng, 1000, 5000)
        table.push(keys, grads, clicks=clicks)
    assert len(table) > checkpoint["rows.key"].size
    table.restore([saved_rows], [saved_pending])
    _assert_same(_snapshot(table), checkpoint)
    assert (table.stats().rows, table.stats().pending) == (
        saved_rows["key"].size, saved_pending["key"].size)  # fmt: skip
    # overlapping parts are refused and change nothing
    half = {name: values[: values.shape[0] // 2] for name, values in saved_rows.items()}
    keys, grads, clicks = _batch(rng, 1000, 5000)
    table.push(keys, grads, clicks=clicks)
    before = _snapshot(table)
    with pytest.raises(InputError, match="already in the table"):
        table.restore([saved_rows, half], [saved_pending])
    _assert_same(_snapshot(table), before)


def _read(records: list[dict]) -> dict:
    """A save's rows and pending keys (all servers), sorted by key."""
    out = {}
    for kind in ("rows", "pending"):
        parts = [read_shard(r["path"])[1] for r in records if r["kind"] == kind]
        merged = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        out.update({f"{kind}.{k}": v for k, v in _sorted(merged).items()})
    return out


def _totals(client) -> dict:
    return client.stats()["total"]["tables"]["emb"]


def test_servers_that_trained_on_then_load_equal_a_fresh_load(tmp_path):
    rng = np.random.default_rng(1)
    with local_cluster(servers=2) as trained, trained.client() as a:
        a.create_table(CONFIG)
        for _ in range(4):
            keys, grads, clicks = _batch(rng, 0, 3000)
            a.push("emb", keys, grads, clicks=clicks).wait()
        saved = a.save("emb", tmp_path / "ckpt")
        checkpoint = _read(saved)
        probe = np.unique(np.concatenate([_batch(rng, 0, 6000)[0] for _ in range(3)]))
        at_save = a.pull("emb", probe).wait()
        for _ in range(4):  # the servers train on past the checkpoint
            keys, grads, clicks = _batch(rng, 1500, 6000)
            a.push("emb", keys, grads, clicks=clicks).wait()
        assert not np.array_equal(a.pull("emb", probe).wait(), at_save)

        # a load that fails half-way: the second file of each kind is corrupt
        before = _read(a.save("emb", tmp_path / "before"))
        pulled = a.pull("emb", probe).wait()
        stats = _totals(a)
        corrupt = [dict(r) for r in sorted(saved, key=lambda r: r["name"])]
        bad = tmp_path / "corrupt.arrow"
        bad.write_bytes(Path(corrupt[-1]["path"]).read_bytes()[:-100])
        corrupt[-1] = {"path": str(bad)}
        with pytest.raises(RemoteError):
            a.load("emb", corrupt)
        assert a.pull("emb", probe).wait().tobytes() == pulled.tobytes()
        assert _totals(a) == stats
        _assert_same(_read(a.save("emb", tmp_path / "after-failure")), before)

        # the real load: exactly the checkpoint
        a.load("emb", saved)
        resumed_pull = a.pull("emb", probe).wait()
        assert resumed_pull.tobytes() == at_save.tobytes()
        _assert_same(_read(a.save("emb", tmp_path / "resumed")), checkpoint)
        resumed_stats = _totals(a)
        more = [_batch(rng, 0, 6000) for _ in range(2)]
        for keys, grads, clicks in more:
            a.push("emb", keys, grads, clicks=clicks).wait()
        resumed_next = a.pull("emb", probe).wait()
        resumed_after = _read(a.save("emb", tmp_path / "resumed-next"))

    # a fresh job (one server: it reads both servers' shard files into one table)
    with local_cluster(servers=1) as fresh, fresh.client() as b:
        b.create_table(CONFIG)
        loaded = b.load("emb", saved)
        assert loaded["rows"] == checkpoint["rows.key"].size
        assert loaded["pending"] == checkpoint["pending.key"].size
        assert b.pull("emb", probe).wait().tobytes() == resumed_pull.tobytes()
        fresh_stats = _totals(b)
        assert (fresh_stats["rows"], fresh_stats["pending"]) == (
            resumed_stats["rows"], resumed_stats["pending"])  # fmt: skip
        for keys, grads, clicks in more:
            b.push("emb", keys, grads, clicks=clicks).wait()
        assert b.pull("emb", probe).wait().tobytes() == resumed_next.tobytes()
        _assert_same(_read(b.save("emb", tmp_path / "fresh-next")), resumed_after)
