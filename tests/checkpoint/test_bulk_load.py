"""The bulk load path (issue 30): one compiled pass copies and checks the rows, one
inserts the keys, routing is decided per shard file.

A broken insert (a key on the wrong row, a lost collision chain, ids handed out twice)
or a broken copy (a column shifted, a statistic swapped) shows up here as a column that
differs from what was saved; bad input must change nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Lifecycle, TableConfig
from sparseps.core.hashing import mix64_array
from sparseps.core.routing import server_of
from sparseps.errors import CheckpointError, InputError
from sparseps.rpc.protocol import Request
from sparseps.server.handlers import ServerState
from sparseps.table import SparseTable
from sparseps.table.hashmap import KeyIndex

pytestmark = pytest.mark.timeout(120)

ROWS = 200_000
CONFIG = TableConfig(name="emb", dim=5, rule=optim.Adagrad(lr=0.1), seed=7,
                     lifecycle=Lifecycle(admission="count", admit_count=2))  # fmt: skip


def _columns(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Saved-table columns with the awkward values: keys 0 and 2**64-1, -0.0,
    subnormals, huge floats, rows touched since the last decay."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**64 - 1, n + n // 8, dtype=np.uint64, endpoint=True))
    keys = rng.permutation(keys)[:n]
    keys[:2] = [0, 2**64 - 1]
    embedding = rng.standard_normal((n, CONFIG.dim)).astype(np.float32)
    embedding[0, :3] = [-0.0, 1e-45, 3e38]
    touched = (rng.random(n) < 0.3).astype(np.uint8)
    unseen = np.where(touched == 1, 0, rng.integers(0, 9, n)).astype(np.int32)
    return {
        "key": keys,
        "embedding": embedding,
        "state": rng.random((n, CONFIG.dim), dtype=np.float32),
        "show": rng.random(n, dtype=np.float32) * 50,
        "click": rng.random(n, dtype=np.float32),
        "unseen_days": unseen,
        "delta_score": rng.random(n, dtype=np.float32),
        "touched": touched,
    }


def _sorted(columns: dict) -> dict:
    order = np.argsort(columns["key"], kind="stable")
    return {name: values[order] for name, values in columns.items()}


def _assert_same(a: dict, b: dict, *, by_key: bool = True) -> None:
    if by_key:
        a, b = _sorted(a), _sorted(b)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def _trained(n: int = 3000) -> SparseTable:
    """A table with rows, pending keys and freed ids (shrink), to restore over."""
    table = SparseTable(CONFIG)
    rng = np.random.default_rng(1)
    for _ in range(4):
        keys = rng.integers(0, n, n).astype(np.uint64) * np.uint64(2654435761) + np.uint64(1)
        table.push(keys, rng.standard_normal((n, CONFIG.dim)).astype(np.float32))
    return table


def _read_only(columns: dict) -> dict:
    """Like a mapped shard file: the load must not need writable arrays."""
    out = {name: values.copy() for name, values in columns.items()}
    for values in out.values():
        values.flags.writeable = False
    return out


def test_restore_of_200k_rows_equals_the_saved_table_bit_for_bit():
    saved = _columns(ROWS)
    table = _trained()
    table.restore([_read_only(saved)])
    assert len(table) == ROWS and table.stats().pending == 0
    _assert_same(table.export_rows(), saved)
    # the rows sit under the right keys: the same as the upsert path, before and after
    # a push (which reads and writes rows through the index)
    reference = SparseTable(CONFIG)
    reference.import_rows(saved)
    probe = np.concatenate([saved["key"][::997], np.array([12345], np.uint64)])
    assert table.pull(probe).tobytes() == reference.pull(probe).tobytes()
    grads = np.random.default_rng(2).standard_normal((probe.size, CONFIG.dim)).astype(np.float32)
    for each in (table, reference):
        each.push(probe, grads)
        each.push(probe, grads)  # admits the new key
    _assert_same(table.export_rows(), reference.export_rows())
    _assert_same(table.export_pending(), reference.export_pending())


def test_strict_import_after_a_shrink_takes_the_freed_ids_first():
    top = np.uint64(1) << np.uint64(63)
    first, second = _columns(5000, seed=3), _columns(3000, seed=4)
    first["key"] &= ~top  # the two parts share no key
    second["key"] |= top
    first["unseen_days"][:1000] = 1000  # beyond shrink_unseen_days: shrink deletes them
    first["touched"][:1000] = 0
    table = SparseTable(CONFIG)
    table.import_rows(first, strict=True)
    assert table.shrink().size == 1000
    table.import_rows(second, strict=True)
    assert table._storage.index.high_water == 5000 + 2000  # the 1000 freed ids were reused
    kept = {name: values[1000:] for name, values in first.items()}
    _assert_same(table.export_rows(), {n: np.concatenate([kept[n], second[n]]) for n in kept})


def _colliding_keys(index: KeyIndex, homes: list[int], per_home: int) -> np.ndarray:
    """Keys whose home slot in ``index`` (capacity fixed by a reserve) is one of ``homes``."""
    candidates = np.arange(1, 4_000_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    hashed = mix64_array(candidates, index.seed)
    home = ((hashed >> np.uint64(32)) * np.uint64(index.capacity)) >> np.uint64(32)
    picked = [candidates[home == h][:per_home] for h in homes]
    assert all(p.size == per_home for p in picked)
    return np.concatenate(picked)


def test_insert_absent_with_colliding_keys_and_a_repeat():
    index = KeyIndex(seed=0x5EED)
    index.reserve(30_000)
    # long probe chains, one wrapping past the last slot, among ordinary keys
    chained = _colliding_keys(index, [index.capacity - 1, 0, 5, 6], 40)
    keys = np.concatenate([chained, np.arange(10**12, 10**12 + 20_000, dtype=np.uint64)])
    keys = np.random.default_rng(5).permutation(keys)
    capacity = index.capacity

    repeated = np.concatenate([keys, keys[100:101], keys[200:300]])
    before = (len(index), index.high_water)
    assert index.insert_absent(repeated, index.planned_ids(repeated.size)) == keys.size
    assert (len(index), index.high_water) == before
    assert (index.find(keys) == -1).all()  # the keys before the repeat are undone

    ids = index.planned_ids(keys.size)
    np.testing.assert_array_equal(ids, np.arange(keys.size))
    assert index.insert_absent(keys, ids) == -1
    assert index.capacity == capacity and len(index) == keys.size
    np.testing.assert_array_equal(index.find(keys), ids)
    # present keys are refused, wherever in the batch, and change nothing
    more = np.array([10**15, keys[7], 10**15 + 1], np.uint64)
    assert index.insert_absent(more, index.planned_ids(3)) == 1
    assert (index.find(more[[0, 2]]) == -1).all() and len(index) == keys.size
    # ids freed by erase come back first, most recent first (as find_or_insert does)
    index.erase(keys[:3])
    expected = index.planned_ids(4)
    np.testing.assert_array_equal(expected, [ids[2], ids[1], ids[0], keys.size])
    assert index.insert_absent(keys[:3][::-1].copy(), expected[:3]) == -1
    np.testing.assert_array_equal(index.find(keys), ids)


def _snapshot(table: SparseTable) -> dict:
    return {**{f"rows.{k}": v for k, v in _sorted(table.export_rows()).items()},
            **{f"pending.{k}": v for k, v in _sorted(table.export_pending()).items()}}  # fmt: skip


# 150k rows: the copy and the insert run on two threads, so a bad row found by the copy
# must take back keys the insert already put in
@pytest.mark.parametrize("rows", [20_000, 150_000])
@pytest.mark.parametrize("fault", ["repeat", "present", "nan", "inf", "unseen"])
def test_bad_input_is_refused_and_changes_nothing(fault, rows):
    table = _trained()
    before = _snapshot(table)
    ids_before = (table._storage.index.high_water, table._storage.index.free_ids)
    columns = _columns(rows, seed=6)
    last = columns["key"].size - 1
    if fault == "repeat":
        columns["key"][last] = columns["key"][5]
    elif fault == "present":
        columns["key"][last] = table.keys()[0]
    elif fault == "nan":
        columns["state"][last, 2] = np.nan
    elif fault == "inf":
        columns["click"][last] = -np.inf
    else:
        columns["unseen_days"][last] = -1
    match = {"repeat": "repeated keys", "present": "already in the table",
             "nan": "NaN/inf", "inf": "NaN/inf", "unseen": "unseen_days"}[fault]  # fmt: skip
    with pytest.raises(InputError, match=match):
        table.import_rows(columns, strict=True)
    _assert_same(_snapshot(table), before, by_key=False)
    index = table._storage.index
    assert (index.high_water, index.free_ids) == ids_before  # no id lost
    parts = [columns]
    if fault == "present":  # a restore starts empty: two parts that overlap
        parts.append({name: values[:1] for name, values in columns.items()})
    with pytest.raises(InputError, match=match):
        table.restore(parts)
    _assert_same(_snapshot(table), before, by_key=False)
    # the refused batch left the table usable: the good rows import after all
    good = {name: values[:last] for name, values in columns.items()}
    table.import_rows(good, strict=fault != "present")
    assert len(table) == len(before["rows.key"]) + last


def _request(op: str, table: str, **args) -> Request:
    return Request(op=op, id=1, table=table, bufs={}, args=args)


def _servers(count: int) -> list[ServerState]:
    states = [ServerState(rank, count, "127.0.0.1:1") for rank in range(count)]
    for state in states:
        state.handle(_request("create_table", "emb", config=CONFIG.to_dict()))
    return states


def test_shard_files_reload_onto_1_2_and_3_servers(tmp_path):
    """Saved on 2 servers: loads onto 2 (per file: each server takes its own file), 3 and
    1 (key by key) hold exactly the saved rows and pending keys, each on its owner."""
    saved = _columns(ROWS, seed=8)
    pending = {"key": np.arange(1, 5001, dtype=np.uint64) * np.uint64(977),
               "show": np.ones(5000, np.float32), "click": np.zeros(5000, np.float32)}  # fmt: skip
    writers = _servers(2)
    for rank, state in enumerate(writers):
        table = state.sparse["emb"].table
        mine = server_of(saved["key"], 2) == rank
        table.import_rows({name: np.ascontiguousarray(v[mine]) for name, v in saved.items()})
        table.import_pending(
            {name: np.ascontiguousarray(v[server_of(pending["key"], 2) == rank])
             for name, v in pending.items()}
        )  # fmt: skip
    records = [r for state in writers
               for r in state.handle(_request("save", "emb", directory=str(tmp_path)))[0]]  # fmt: skip
    assert len(records) == 4
    for count in (2, 3, 1):
        states = _servers(count)
        rows, pend = [], []
        for rank, state in enumerate(states):
            state.sparse["emb"].table.push(saved["key"][:50], np.ones((50, 5), np.float32))
            loaded, _ = state.handle(_request("load", "emb", files=records))
            table = state.sparse["emb"].table
            assert loaded["files"] == 4 and loaded["rows"] == len(table)
            got, got_pending = table.export_rows(), table.export_pending()
            assert (server_of(got["key"], count) == rank).all()
            assert (server_of(got_pending["key"], count) == rank).all()
            rows.append(got)
            pend.append(got_pending)
        _assert_same({n: np.concatenate([r[n] for r in rows]) for n in saved}, saved)
        assert np.array_equal(np.sort(np.concatenate([p["key"] for p in pend])), pending["key"])
        if count == 2:  # per file: the other rank's file adds nothing, its own all rows
            only_other, _ = states[1].handle(_request("load", "emb", files=[
                r for r in records if r["rank"] == 0]))  # fmt: skip
            assert only_other == {"rows": 0, "pending": 0, "files": 2}
            assert len(states[1].sparse["emb"].table) == 0


@pytest.mark.parametrize("kind", ["xxh3_128", "sha256"])
@pytest.mark.parametrize("value", [b"\x00", b"\xff"])
def test_a_changed_byte_fails_the_load_even_though_the_import_ran_beside_the_hash(
    tmp_path, value, kind
):
    """The checksum is verified while the rows are imported into the table aside: a file
    whose import succeeds (or fails: 0xff bytes make NaNs) but whose bytes changed fails
    with the checksum error, and the live table is unchanged. ``xxh3_128``: a save's
    record as is (the load verifies it, not SHA-256); ``sha256``: a record of a file saved
    before xxh3_128 was recorded."""
    (state,) = _servers(1)
    table = state.sparse["emb"].table
    table.import_rows(_columns(20_000, seed=9))
    records, _ = state.handle(_request("save", "emb", directory=str(tmp_path)))
    table.push(np.arange(1, 100, dtype=np.uint64), np.ones((99, 5), np.float32))
    before = _snapshot(state.sparse["emb"].table)
    assert all(r["sha256"] and r["xxh3_128"] for r in records)
    if kind == "sha256":
        records = [{k: v for k, v in r.items() if k != "xxh3_128"} for r in records]
    rows = next(r for r in records if r["kind"] == "rows")
    with open(rows["path"], "r+b") as handle:  # the middle of the file: column data
        handle.seek(rows["bytes"] // 2)
        handle.write(value * 4)
    with pytest.raises(CheckpointError, match=f"{kind} does not match"):
        state.handle(_request("load", "emb", files=records))
    _assert_same(_snapshot(state.sparse["emb"].table), before, by_key=False)


def test_a_copy_that_breaks_beside_the_insert_takes_the_keys_back(monkeypatch):
    """On two threads the insert may finish before the copy fails (here: out of memory):
    the inserted keys are taken back, the table is as before and still takes imports."""
    from sparseps.table import restore

    table = _trained()
    before = _snapshot(table)
    ids_before = (table._storage.index.high_water, table._storage.index.free_ids)
    columns = _columns(150_000, seed=11)

    def broken_copy(*args, **kwargs):
        raise MemoryError("injected")

    monkeypatch.setattr(restore, "copy_new_rows", broken_copy)
    with pytest.raises(MemoryError, match="injected"):
        table.import_rows(columns, strict=True)
    _assert_same(_snapshot(table), before, by_key=False)
    assert (table._storage.index.high_water, table._storage.index.free_ids) == ids_before
    monkeypatch.undo()
    table.import_rows(columns, strict=True)
    assert len(table) == len(before["rows.key"]) + 150_000
