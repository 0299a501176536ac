"""Export / import round trips bit-exactly; erased rows' memory is reused."""

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Initializer, Lifecycle, TableConfig
from sparseps.table import SparseTable


def _sorted(columns):
    order = np.argsort(columns["key"], kind="stable")
    return {k: v[order] for k, v in columns.items()}


def _assert_same(a, b):
    a, b = _sorted(a), _sorted(b)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _trained(rule, lifecycle=None, seed=0):
    lifecycle = lifecycle or Lifecycle()
    config = TableConfig(name="t", dim=5, rule=rule, initializer=Initializer.normal(0, 0.1),
                         lifecycle=lifecycle, seed=seed)  # fmt: skip
    table = SparseTable(config)
    rng = np.random.default_rng(seed)
    for day in range(3):
        for _ in range(5):
            keys = rng.integers(0, 3000, 400).astype(np.uint64)
            keys[:2] = [0, 2**64 - 1]
            grads = rng.normal(size=(400, 5)).astype(np.float32)
            clicks = (rng.random(400) < 0.2).astype(np.float32)
            table.push(keys, grads, clicks=clicks)
        if day < 2:
            table.decay()
    return table


@pytest.mark.parametrize(
    "rule",
    [optim.Adam(lr=0.01), optim.FTRL(l1=0.1), optim.RowwiseAdagrad(), optim.SGD()],
    ids=lambda r: r.name,
)
def test_round_trip_is_bit_exact(rule):
    table = _trained(rule, Lifecycle(admission="count", admit_count=2))
    rows, pending = table.export_rows(), table.export_pending()
    assert rows["key"].size > 1000 and pending["key"].size > 100
    assert rows["embedding"].shape == (rows["key"].size, 5)
    assert rows["state"].shape == (rows["key"].size, rule.state_dim(5))
    assert (
        rows["unseen_days"].dtype == np.int32
        and rows["touched"].any()
        and (rows["unseen_days"] > 0).any()
    )
    copy = SparseTable(table.config)
    copy.import_rows(rows)
    copy.import_pending(pending)
    _assert_same(copy.export_rows(), rows)
    _assert_same(copy.export_pending(), pending)
    # the copy behaves identically from here on (state, counters, admission, decay)
    keys = np.arange(0, 4000, 3, dtype=np.uint64)
    grads = np.random.default_rng(1).normal(size=(keys.size, 5)).astype(np.float32)
    for t in (table, copy):
        t.push(keys, grads)
        t.decay()
    _assert_same(copy.export_rows(), table.export_rows())
    np.testing.assert_array_equal(copy.pull(keys), table.pull(keys))
    np.testing.assert_array_equal(np.sort(copy.shrink()), np.sort(table.shrink()))


def test_import_without_optional_columns_and_upsert():
    table = _trained(optim.Adagrad())
    rows = table.export_rows()
    plain = {k: v for k, v in rows.items() if k != "touched"}
    copy = SparseTable(table.config)
    copy.import_rows(plain)
    got = _sorted(copy.export_rows())
    assert not got["touched"].any()
    np.testing.assert_array_equal(got["embedding"], _sorted(rows)["embedding"])
    # upsert: importing again overwrites, it does not duplicate
    changed = dict(plain, embedding=np.zeros_like(plain["embedding"]))
    copy.import_rows(changed)
    assert len(copy) == rows["key"].size and not copy.pull(rows["key"]).any()


def test_import_row_replaces_pending_entry():
    table = SparseTable(
        TableConfig(name="t", dim=2, lifecycle=Lifecycle(admission="count", admit_count=9))
    )
    keys = np.array([1, 2], np.uint64)
    table.push(keys, np.ones((2, 2), np.float32))
    assert table.stats().pending == 2
    table.import_rows({
        "key": keys[:1], "embedding": np.ones((1, 2), np.float32), "state": np.zeros((1, 2), np.float32),
        "show": np.ones(1, np.float32), "click": np.zeros(1, np.float32),
        "unseen_days": np.zeros(1, np.int32), "delta_score": np.zeros(1, np.float32),
    })  # fmt: skip
    assert table.stats().pending == 1 and len(table) == 1
    np.testing.assert_array_equal(table.pull(keys), [[1, 1], [0, 0]])


def test_delta_score_and_reset():
    table = SparseTable(
        TableConfig(name="t", dim=2, lifecycle=Lifecycle(nonclick_coeff=0.5, click_coeff=2.0))
    )
    keys = np.array([4, 4, 5], np.uint64)
    table.push(keys, np.zeros((3, 2), np.float32), shows=np.array([1, 2, 1], np.float32),
               clicks=np.array([1, 0, 0], np.float32))  # fmt: skip
    rows = _sorted(table.export_rows())
    # key 4: show 3, click 1 -> (3-1)*0.5 + 1*2 = 3.0; key 5: 0.5
    np.testing.assert_array_equal(rows["delta_score"], [3.0, 0.5])
    table.reset_delta_score()
    assert not table.export_rows()["delta_score"].any()
    table.push(keys[2:], np.zeros((1, 2), np.float32))
    np.testing.assert_array_equal(_sorted(table.export_rows())["delta_score"], [0.0, 0.5])


def test_push_delta_adds_without_rule():
    table = SparseTable(
        TableConfig(
            name="t", dim=2, rule=optim.Adam(clip=(-0.1, 0.1)), initializer=Initializer.zeros()
        )
    )
    keys = np.array([8, 8, 9], np.uint64)
    table.push_delta(keys, np.array([[1, 2], [3, 4], [5, 6]], np.float32))
    np.testing.assert_array_equal(table.pull(np.array([8, 9], np.uint64)), [[4, 6], [5, 6]])
    rows = _sorted(table.export_rows())
    assert rows["show"].tolist() == [2, 1] and not rows["state"].any()  # no optimizer step


def test_erased_rows_memory_is_reused():
    policy = Lifecycle(shrink_unseen_days=0)
    table = SparseTable(TableConfig(name="t", dim=8, lifecycle=policy))
    first = np.arange(20000, dtype=np.uint64)
    table.push(first, np.ones((first.size, 8), np.float32))
    table.decay()
    table.push(first[:10000], np.ones((10000, 8), np.float32))  # the other half goes stale
    table.decay()
    deleted = table.shrink()
    np.testing.assert_array_equal(deleted, first[10000:])
    capacity, used = table.stats().capacity, table._storage.index.high_water
    for round_ in range(3):  # erase and re-insert repeatedly: storage never grows
        fresh = np.arange(10**6 * (round_ + 1), 10**6 * (round_ + 1) + 10000, dtype=np.uint64)
        table.push(fresh, np.ones((fresh.size, 8), np.float32))
        assert len(table) == 20000
        assert table.stats().capacity == capacity and table._storage.index.high_water == used
        table.decay()
        table.push(first[:10000], np.ones((10000, 8), np.float32))
        table.decay()
        np.testing.assert_array_equal(table.shrink(), fresh)
    stats = table.stats()
    assert (
        stats.rows == 10000
        and stats.dim == 8
        and stats.bytes_used >= 20000 * table.layout.payload_bytes
    )


def test_reserve_contains_keys_and_stats():
    table = SparseTable(TableConfig(name="t", dim=3, rule=optim.Adam()))
    table.reserve(5000)
    capacity = table.stats().capacity
    assert capacity >= 5000
    keys = np.arange(4000, dtype=np.uint64) * np.uint64(7919)
    table.push(keys, np.zeros((keys.size, 3), np.float32))
    stats = table.stats()
    assert stats.capacity == capacity and stats.rows == len(table) == 4000 and stats.pending == 0
    assert stats.name == "t" and stats.dim == 3 and stats.bytes_used == table.nbytes
    np.testing.assert_array_equal(np.sort(table.keys()), keys)
    probe = np.array([0, 7919, 1, 2**64 - 1], np.uint64)
    assert table.contains(probe).tolist() == [True, True, False, False]
    assert table.pull(np.empty(0, np.uint64)).shape == (0, 3)
    table.push(np.empty(0, np.uint64), np.empty((0, 3), np.float32))  # an empty push is a no-op
    assert len(table) == 4000


@pytest.mark.parametrize("admission", ["always", "count"])
def test_pull_is_read_only(admission):
    table = _trained(optim.Adam(), Lifecycle(admission=admission, admit_count=2))
    before_rows, before_pending, before_stats = (
        table.export_rows(),
        table.export_pending(),
        table.stats(),
    )
    probe = np.arange(0, 10000, 7, dtype=np.uint64)  # live rows, pending keys, never-seen keys
    first = table.pull(probe)
    assert table.stats() == before_stats
    _assert_same(table.export_rows(), before_rows)
    _assert_same(table.export_pending(), before_pending)
    np.testing.assert_array_equal(table.pull(probe), first)
    if admission == "count":  # pending and never-seen keys read as zeros
        assert not first[~table.contains(probe)].any()


@pytest.mark.parametrize("state_dim", [0, 3])
def test_compiled_row_gather_equals_the_numpy_gather(state_dim, tmp_path):
    """export_rows gathers full rows in one compiled pass; the per-column numpy gather (a
    memory-mapped disk tier's path) is the oracle, bit for bit, touched marks included."""
    from sparseps.table.columns import gather_columns

    dim, n = 4, 5000
    stat0 = dim + state_dim
    where = {"dim": dim, "show": stat0, "click": stat0 + 1, "delta_score": stat0 + 2,
             "unseen": stat0 + 3}  # fmt: skip
    rng = np.random.default_rng(2)
    storage = rng.standard_normal((n + 7, stat0 + 4)).astype(np.float32)
    storage[:, stat0 + 3] = rng.choice(np.array([-1, 0, 1, 5, 300], np.float32), n + 7)
    storage[3, :2] = [-0.0, np.float32(1e-45)]
    ids = rng.permutation(n + 7)[:n].astype(np.int32)
    keys = rng.integers(0, 2**63, n, dtype=np.uint64)
    fast = gather_columns(storage, keys, ids, where)
    storage.tofile(tmp_path / "rows.bin")  # a memory map takes the numpy path
    mapped = np.memmap(tmp_path / "rows.bin", np.float32, "r", shape=storage.shape)
    slow = gather_columns(mapped, keys, ids, where)
    assert fast.keys() == slow.keys()
    for name in fast:
        assert fast[name].dtype == slow[name].dtype, name
        assert np.asarray(fast[name]).tobytes() == np.asarray(slow[name]).tobytes(), name
