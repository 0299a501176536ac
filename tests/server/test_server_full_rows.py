"""The whole-row ops of GPUPS: ``pull_full`` (embedding + optimizer state) and
``write_rows`` (upsert: embedding and state overwritten, counters added as push_delta
adds them), in the table, through the servers, refused when malformed, and replicated."""

from __future__ import annotations

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Lifecycle, TableConfig
from sparseps.errors import InputError, RemoteError
from sparseps.rpc.protocol import encode_request
from sparseps.table import SparseTable
from sparseps.testing import local_cluster
from sparseps.testing.faults import RawPeer

pytestmark = pytest.mark.timeout(120)

DIM = 3
CONFIG = TableConfig(name="emb", dim=DIM, rule=optim.Adam(lr=0.05), seed=5)
WIDTH = DIM + CONFIG.rule.state_dim(DIM)  # 3 + m, v, t = 3 + 7
KEYS = np.arange(1, 41, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


def _rows(n: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)
    rows[:, DIM:] = np.abs(rows[:, DIM:])
    return rows


def _trained() -> SparseTable:
    table = SparseTable(CONFIG)
    grads = np.random.default_rng(1).standard_normal((20, DIM)).astype(np.float32)
    table.push(KEYS[:20], grads, clicks=np.ones(20, np.float32))
    return table


def test_pull_full_is_the_stored_embedding_and_state_and_missing_keys_start_fresh():
    table = _trained()
    full = table.pull_full(KEYS)
    assert full.shape == (40, WIDTH) and full.dtype == np.float32
    np.testing.assert_array_equal(full[:, :DIM], table.pull(KEYS))  # old and new keys
    exported = table.export_rows()
    at = {int(k): i for i, k in enumerate(exported["key"])}
    stored = exported["state"][[at[int(k)] for k in KEYS[:20]]]
    np.testing.assert_array_equal(full[:20, DIM:], stored)
    initial = CONFIG.rule.initial_state(DIM)
    np.testing.assert_array_equal(full[20:, DIM:], np.broadcast_to(initial, (20, WIDTH - DIM)))
    assert len(table) == 20  # a pull creates nothing


def test_write_rows_overwrites_embedding_and_state_and_adds_counters_like_push_delta():
    table, twin = _trained(), _trained()
    rows = _rows(30)
    shows = np.full(30, 2.0, np.float32)
    clicks = (np.arange(30) % 2).astype(np.float32)
    keys = KEYS[10:40]  # 10 existing rows, 20 new ones
    table.write_rows(keys, rows, shows=shows, clicks=clicks)
    np.testing.assert_array_equal(table.pull_full(keys), rows)  # bit for bit
    # the counters: exactly what a push_delta of the same counts does
    twin.push_delta(keys, np.zeros((30, DIM), np.float32), shows=shows, clicks=clicks)
    got, want = table.export_rows(), twin.export_rows()
    order_got, order_want = np.argsort(got["key"]), np.argsort(want["key"])
    for column in ("key", "show", "click", "delta_score", "unseen_days", "touched"):
        np.testing.assert_array_equal(got[column][order_got], want[column][order_want], column)
    np.testing.assert_array_equal(table.pull_full(KEYS[:10]), twin.pull_full(KEYS[:10]))


def test_write_rows_admits_a_pending_key_from_its_counters():
    config = TableConfig(name="p", dim=DIM, rule=optim.SGD(lr=0.1),
                         lifecycle=Lifecycle(admission="count", admit_count=5))  # fmt: skip
    table = SparseTable(config)
    key = KEYS[:1]
    table.push(key, np.ones((1, DIM), np.float32), shows=np.full(1, 2.0, np.float32))
    assert len(table) == 0 and table.stats().pending == 1
    table.write_rows(key, np.full((1, DIM), 0.5, np.float32), shows=np.ones(1, np.float32))
    assert len(table) == 1 and table.stats().pending == 0
    assert table.export_rows()["show"][0] == 3.0  # 2 pending + 1 written


def test_write_rows_refuses_bad_input_and_changes_nothing():
    table = _trained()
    before = table.export_rows()
    bad = [
        (KEYS[:2], _rows(2)[:, :DIM].copy(), None, r"shape \(2, 10\)"),  # the embedding alone
        (KEYS[:2], _rows(2).astype(np.float64), None, "float32"),
        (KEYS[[0, 0]], _rows(2), None, "unique"),
        (KEYS[:2], np.full((2, WIDTH), np.nan, np.float32), None, "NaN"),
        (KEYS[:2], _rows(2), np.array([-1, 1], np.float32), ">= 0"),
    ]
    for keys, rows, shows, words in bad:
        with pytest.raises(InputError, match=words):
            table.write_rows(keys, rows, shows=shows)
    after = table.export_rows()
    for column in before:
        np.testing.assert_array_equal(after[column], before[column])


def test_a_tiered_table_reads_and_writes_whole_rows_like_an_in_memory_one(tmp_path):
    tiered = SparseTable(TableConfig(**{**CONFIG.__dict__, "memory_rows": 8}),
                         disk_dir=str(tmp_path))  # fmt: skip
    plain = SparseTable(CONFIG)
    for table in (tiered, plain):
        table.push(KEYS[:20], np.ones((20, DIM), np.float32))
        table.write_rows(KEYS[10:40], _rows(30), shows=np.ones(30, np.float32))
    np.testing.assert_array_equal(tiered.pull_full(KEYS), plain.pull_full(KEYS))
    got, want = tiered.export_rows(), plain.export_rows()
    order_got, order_want = np.argsort(got["key"]), np.argsort(want["key"])
    for column in want:
        np.testing.assert_array_equal(got[column][order_got], want[column][order_want], column)
    tiered.close()


def test_the_servers_answer_whole_rows_and_refuse_malformed_ones():
    reference = _trained()
    rows = _rows(40, seed=2)
    with local_cluster(servers=2) as cluster, cluster.client(timeout=30) as client:
        client.create_table(CONFIG)
        client.push("emb", KEYS[:20], np.random.default_rng(1).standard_normal((20, DIM))
                    .astype(np.float32), clicks=np.ones(20, np.float32)).wait()  # fmt: skip
        np.testing.assert_array_equal(
            client.pull_full("emb", KEYS).wait(), reference.pull_full(KEYS)
        )
        dup = np.concatenate([KEYS[::-1], KEYS[:3]])  # any order, repeats
        np.testing.assert_array_equal(client.pull_full("emb", dup).wait(), reference.pull_full(dup))
        client.write_rows("emb", KEYS, rows, shows=np.ones(40, np.float32)).wait()
        reference.write_rows(KEYS, rows, shows=np.ones(40, np.float32))
        np.testing.assert_array_equal(client.pull_full("emb", KEYS).wait(), rows)
        # the client refuses what it can see
        with pytest.raises(InputError, match="unique"):
            client.write_rows("emb", KEYS[[0, 0]], rows[:2])
        with pytest.raises(InputError, match="finite"):
            client.write_rows("emb", KEYS[:1], np.full((1, WIDTH), np.inf, np.float32))
        # the servers refuse the wrong width, naming the table's full row
        with pytest.raises(RemoteError, match="10 \\(embedding dim 3 \\+ 7 optimizer state"):
            client.write_rows("emb", KEYS[:4], rows[:4, :DIM].copy()).wait()
        # raw frames a client would not send: the wrong dtype, rows that do not match keys
        shard0 = KEYS[:8]  # refused before routing is looked at
        with RawPeer(cluster.endpoints[0]) as peer:
            peer.send(encode_request("write_rows", 1, "emb", [shard0, rows[:8].astype(np.int32)]))
            peer.send(encode_request("write_rows", 2, "emb", [shard0, rows[:3]]))
            peer.send(encode_request("pull_full", 3, "emb", [shard0.astype(np.int64)]))
            replies = peer.replies(3, timeout=20)
        for reply in replies:
            assert reply["ok"] is False and reply["error"]["type"] == "ProtocolError", reply
        messages = " ".join(r["error"]["message"] for r in replies)
        assert "float32" in messages and "uint64" in messages and "rows" in messages
        # nothing changed, and the servers still serve
        np.testing.assert_array_equal(
            client.pull_full("emb", KEYS).wait(), reference.pull_full(KEYS)
        )
        assert client.stats()["total"]["bad_messages"] >= 3


def test_a_write_reaches_the_backup_copy_and_survives_its_primary():
    rows = _rows(40, seed=3)
    with local_cluster(servers=2, replicas=1, timeout=30) as cluster:
        client = cluster.client(timeout=30)
        client.create_table(CONFIG)
        client.write_rows("emb", KEYS, rows, shows=np.full(40, 3.0, np.float32)).wait()
        cluster.kill(0)  # shard 0 now lives only in its backup on server 1
        np.testing.assert_array_equal(client.pull_full("emb", KEYS).wait(), rows)
        stats = client.stats()
        assert stats["total"]["tables"]["emb"]["rows"] == 40
        client.close()
