"""The CTR accessor on one table (issue 54): split rows against a numpy oracle, bit-exact.

``sparseps.testing.ctr_reference.CtrReference`` applies docs/table.md's rules key by key;
every push here goes through a real ``SparseTable`` and the reference, and every pull,
export, shrink and save filter must agree exactly (no tolerance: both do the same float64
operations and round once to float32 or float16).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Accessor, Initializer, Lifecycle, TableConfig, ctr_table
from sparseps.errors import ConfigError, InputError
from sparseps.table import SparseTable
from sparseps.table.lifecycle import base_keep, delta_keep
from sparseps.testing.ctr_reference import CtrReference

DIM = 5  # embed_w + 4 embedx columns


def _config(dtype="float32", threshold=1.0, **accessor) -> TableConfig:
    return TableConfig(
        name="ctr",
        dim=DIM,
        rule=optim.SparseAdagrad(lr=0.1, initial_g2sum=3.0),
        initializer=Initializer.uniform(-0.1, 0.1),
        lifecycle=Lifecycle(shrink_score=0.15, shrink_unseen_days=2, base_score=0.3),
        seed=7,
        accessor=Accessor(
            embed_dim=1,
            embed_rule=optim.SGD(lr=0.05, clip=(-1.0, 1.0)),
            embedx_threshold=threshold,
            embedx_dtype=dtype,
            cvm=True,
            delta_threshold=0.2,
            delta_keep_days=1,
            **accessor,
        ),  # fmt: skip
    )


def _batches(seed: int, n: int = 12, keys: int = 150, size: int = 80):
    rng = np.random.default_rng(seed)
    for _ in range(n):  # skewed: a few keys in most batches, many seen once or twice
        k = (rng.pareto(0.7, size) * 3).astype(np.int64) % keys
        k = k.astype(np.uint64)
        g = rng.normal(0, 1.0, (size, DIM)).astype(np.float32)
        clicks = (rng.random(size) < 0.15).astype(np.float32)
        yield k, g, clicks


def _digest(table: SparseTable) -> str:
    columns = table.export_rows()
    order = np.argsort(columns["key"])
    h = hashlib.sha256()
    for name in sorted(columns):
        h.update(name.encode())
        h.update(np.ascontiguousarray(columns[name][order]).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_split_rows_equal_the_numpy_oracle(dtype):
    """Score, embedx creation at the threshold, both rules, CVM values, decay, delete,
    the delta and base filters and the delta reset: all bit-equal to the reference."""
    config = _config(dtype)
    table, ref = SparseTable(config), CtrReference(config)
    probe = np.arange(160, dtype=np.uint64)  # trained keys and never seen ones
    for step, (keys, grads, clicks) in enumerate(_batches(1)):
        table.push(keys, grads, clicks=clicks)
        ref.push(keys, grads, clicks=clicks)
        np.testing.assert_array_equal(table.pull(probe), ref.pull(probe), err_msg=f"push {step}")
        assert table.stats().embedx_rows == len(ref.has_embedx())
        if step in (5, 8):  # a day ends: decay, then delete
            table.decay(0.5)
            ref.decay(0.5)
            deleted = table.shrink().tolist()
            assert deleted == ref.shrink() and deleted
    columns = table.export_rows()
    has = {int(k) for k, h in zip(columns["key"], columns["has_embedx"], strict=True) if h}
    assert has == ref.has_embedx() and 0 < len(has) < len(ref.rows)
    lifecycle, accessor = config.lifecycle, config.accessor
    kept = base_keep(columns["show"], columns["click"], lifecycle)
    assert {int(k) for k in columns["key"][kept]} == ref.base_keep()
    unseen = columns["unseen_days"]
    kept = delta_keep(columns["show"], columns["click"], columns["delta_score"], unseen,
                      lifecycle, accessor)  # fmt: skip
    assert {int(k) for k in columns["key"][kept]} == ref.delta_keep()
    assert 0 < kept.sum() < len(ref.rows)  # the filters keep some rows and drop others
    table.reset_delta_score()
    ref.reset_delta()
    columns = table.export_rows()
    by_key = dict(zip(columns["key"].tolist(), columns["delta_score"].tolist(), strict=True))
    assert by_key == {k: np.float32(r.delta) for k, r in ref.rows.items()}


def test_embedx_is_created_exactly_when_the_score_reaches_the_threshold():
    config = _config(threshold=1.0)
    table = SparseTable(config)
    key = np.array([5], np.uint64)
    grad = np.ones((1, DIM), np.float32)
    for show in range(1, 10):  # 0.1 per show without clicks: 1.0 at the 10th
        table.push(key, grad)
        assert table.stats().embedx_rows == 0, show
        assert not table.pull(key)[0, 3:].any()  # cvm, embed_w, then zeros
    table.push(key, grad)
    assert table.stats().embedx_rows == 1
    pulled = table.pull(key)[0]
    start = np.zeros((1, DIM), np.float32)
    CtrReference(config)._initial(5)  # the reference knows the initial value
    ref = CtrReference(config)
    for _ in range(10):
        ref.push(key, grad)
    np.testing.assert_array_equal(pulled, ref.pull(key)[0])
    assert (pulled[3:] != start[0, 1:]).all()  # created from the initializer, then stepped


def test_today_tables_are_the_default_accessor():
    """The default accessor is today's table: its config dict has no accessor key, and a
    table built from it behaves as before (pull of a never-seen key = its initial value)."""
    config = TableConfig(name="t", dim=4)
    assert "accessor" not in config.to_dict()
    assert config.accessor == Accessor() and not config.accessor.split
    assert TableConfig.from_dict(config.to_dict()) == config
    split = _config()
    assert TableConfig.from_dict(split.to_dict()) == split
    table = SparseTable(TableConfig(name="t", dim=4, accessor=Accessor(embed_dim=1)))
    keys = np.array([3, 4], np.uint64)
    # embedx from the start (threshold 0): a never-seen key reads its first push's value
    np.testing.assert_array_equal(table.pull(keys)[:, 1:], SparseTable(
        TableConfig(name="t", dim=4)).pull(keys)[:, 1:])  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embedx_threshold": 1.0}, "needs embed_dim=1"),
        ({"embed_dim": 2}, "embed_dim"),
        ({"embedx_dtype": "float16"}, "needs embed_dim=1"),
        ({"embed_dim": 1, "embedx_threshold": -1.0}, "embedx_threshold"),
        ({"embed_dim": 1, "delta_keep_days": -1}, "delta_keep_days"),
        ({"embed_dim": 1, "slot_dims": [("a", 0)]}, "slot_dims"),
        ({"embed_dim": 1, "slot_dims": [("a", 2), ("a", 3)]}, "twice"),
    ],
)
def test_accessor_fields_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Accessor(**kwargs)


def test_table_checks_of_the_accessor():
    with pytest.raises(ConfigError, match="no embedx column"):
        TableConfig(name="t", dim=1, accessor=Accessor(embed_dim=1))
    with pytest.raises(ConfigError, match="float16 kernel"):
        TableConfig(name="t", dim=3, accessor=Accessor(embed_dim=1, embedx_dtype="float16"))
    with pytest.raises(ConfigError, match="wider than the embedx"):
        TableConfig(name="t", dim=3, accessor=Accessor(embed_dim=1, slot_dims=[("a", 3)]))


def test_ctr_table_maps_paddle_fields():
    config = ctr_table(
        "emb", 8, embedx_threshold=10, base_threshold=1.5, delta_threshold=0.25,
        delta_keep_days=16, show_click_decay_rate=0.98, delete_threshold=0.8,
        delete_after_unseen_days=30, nonclk_coeff=0.1, click_coeff=1,
        embedx_sgd={"name": "SparseAdaGradSGDRule", "learning_rate": 0.05,
                    "initial_g2sum": 3, "initial_range": 1e-4, "weight_bounds": [-10, 10]},
        embed_sgd={"name": "SparseNaiveSGDRule", "learning_rate": 0.02},
    )  # fmt: skip
    assert config.dim == 9 and config.embedx_dim == 8 and config.pull_dim == 11
    assert config.rule == optim.SparseAdagrad(lr=0.05, initial_g2sum=3.0, clip=(-10, 10))
    assert config.initializer == Initializer.uniform(-1e-4, 1e-4)
    assert config.accessor.embed_rule == optim.SGD(lr=0.02, clip=(-10, 10))
    life = config.lifecycle
    assert (life.decay_rate, life.shrink_score, life.shrink_unseen_days, life.base_score) == (
        0.98, 0.8, 30, 1.5,
    )  # fmt: skip
    assert (config.accessor.delta_threshold, config.accessor.delta_keep_days) == (0.25, 16)
    with pytest.raises(ConfigError, match="not mapped"):
        ctr_table("emb", 8, embedx_sgd={"name": "SparseAdamSGDRule"})


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_export_import_restore_and_full_rows_are_bit_exact(dtype, tmp_path):
    config = _config(dtype)
    table = SparseTable(config)
    for keys, grads, clicks in _batches(2):
        table.push(keys, grads, clicks=clicks)
    columns = table.export_rows()
    copy = SparseTable(config)
    copy.import_rows(columns, strict=True)
    assert _digest(copy) == _digest(table)
    # without has_embedx a row has an embedx part when its score reaches the threshold
    derived = SparseTable(config)
    derived.import_rows({k: v for k, v in columns.items() if k != "has_embedx"})
    assert derived.stats().embedx_rows == table.stats().embedx_rows  # no decay: same rows
    # restore is exactly the parts; moving a shard's keys carries both parts
    copy.push(np.array([999], np.uint64), np.ones((1, DIM), np.float32))
    copy.restore([columns], [table.export_pending()])
    assert _digest(copy) == _digest(table)
    keys = np.sort(columns["key"])[:20]
    rows, pending = table.export_keys(keys)
    moved = SparseTable(config)
    moved.import_rows(rows)
    np.testing.assert_array_equal(moved.pull(keys), table.pull(keys))
    # GPUPS' whole rows: both parts and both states, written back unchanged
    full = table.pull_full(keys)
    assert full.shape == (20, DIM + 1)  # the pulled vector, then the embedx g2sum (SGD: none)
    again = SparseTable(config)
    again.import_rows(rows)
    again.write_rows(keys, full, shows=np.zeros(20, np.float32), clicks=np.zeros(20, np.float32))
    np.testing.assert_array_equal(again.pull_full(keys), full)
    # a tiered table holds the same rows, bit for bit
    tiered = SparseTable(TableConfig.from_dict({**config.to_dict(), "memory_rows": 8}),
                         disk_dir=str(tmp_path))  # fmt: skip
    try:
        tiered.import_rows(columns, strict=True)
        assert _digest(tiered) == _digest(table)
    finally:
        tiered.close()


def test_tiered_split_table_equals_the_in_memory_one(tmp_path):
    config = _config("float16", threshold=0.5)
    memory = SparseTable(config)
    tiered = SparseTable(TableConfig.from_dict({**config.to_dict(), "memory_rows": 10}),
                         disk_dir=str(tmp_path))  # fmt: skip
    probe = np.arange(160, dtype=np.uint64)
    try:
        for step, (keys, grads, clicks) in enumerate(_batches(3, n=10)):
            memory.push(keys, grads, clicks=clicks)
            tiered.push(keys, grads, clicks=clicks)
            np.testing.assert_array_equal(tiered.pull(probe), memory.pull(probe))
            if step == 4:
                for table in (memory, tiered):
                    table.decay(0.5)
                assert tiered.shrink().tolist() == memory.shrink().tolist()
        assert tiered.stats().disk_reads > 0  # rows went to disk and came back
        assert _digest(tiered) == _digest(memory)
        memory.reset_delta_score()
        tiered.reset_delta_score()
        assert _digest(tiered) == _digest(memory)
    finally:
        tiered.close()


def test_a_failed_push_leaves_both_parts_unchanged():
    config = _config()
    table = SparseTable(config)
    for keys, grads, clicks in _batches(4, n=4):
        table.push(keys, grads, clicks=clicks)
    before = _digest(table)
    keys = np.arange(10, dtype=np.uint64)
    bad = np.ones((10, DIM), np.float32)
    bad[3, 2] = np.nan
    with pytest.raises(InputError, match="NaN"):
        table.push(keys, bad)
    assert _digest(table) == before
    with pytest.raises(InputError):
        table.push(keys, np.ones((10, DIM + 1), np.float32))
    assert _digest(table) == before


def test_split_table_memory_is_its_parts():
    """A row without an embedx part costs its base row, key and index slot; an embedx
    part its own row: far less than a full row while few rows earn one."""
    config = _config(threshold=1000.0)
    table = SparseTable(config)
    keys = np.arange(200_000, dtype=np.uint64)
    table.push(keys, np.zeros((keys.size, DIM), np.float32))
    assert table.stats().embedx_rows == 0
    full = SparseTable(TableConfig(name="f", dim=4, rule=optim.Adagrad()))
    full.push(keys, np.zeros((keys.size, 4), np.float32))
    assert table.nbytes < 0.6 * full.nbytes


def test_out_of_memory_while_creating_embedx_parts_leaves_both_parts_unchanged():
    """The push steps existing embedx parts in place, then fails to grow the embedx
    matrix for the parts it creates: the backup goes back, nothing of the push stays."""
    from sparseps.errors import ResourceError
    from sparseps.testing.faults import FailingAllocator

    allocator = FailingAllocator()
    config = _config(threshold=0.25)
    table = SparseTable(config, allocator=allocator)
    keys = np.arange(300, dtype=np.uint64)
    table.push(keys, np.ones((300, DIM), np.float32), clicks=(keys % 2).astype(np.float32))
    assert 0 < table.stats().embedx_rows < 300  # odd keys (a click) have a part
    before = _digest(table)
    allocator.armed = True
    allocator.minimum = 1  # the next growth fails
    more = np.arange(300, 5000, dtype=np.uint64)
    with pytest.raises(ResourceError, match="unchanged"):  # odd keys step, even ones create
        table.push(np.concatenate([keys, more]), np.ones((5000, DIM), np.float32))
    assert _digest(table) == before
    allocator.armed = False
    for _ in range(2):  # even keys reach 0.3 at their third show
        table.push(keys, np.ones((300, DIM), np.float32))
    assert table.stats().embedx_rows == 300  # the pushes go through once memory allows
