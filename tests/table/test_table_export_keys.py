"""``export_keys`` (the rows of a moving shard, sparseps.elastic.server_moves) of a tiered
table against the same export of an in-memory table fed the same pushes: a few keys are
read where their disk copies are, most of the table in one pass over the file, and either
way rows and pending counters equal the in-memory table's, bit for bit, including rows
pushed since the last write to disk."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Lifecycle, TableConfig
from sparseps.table import SparseTable

DIM = 4
POOL = np.arange(1, 6001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


def _pair(tmp_path) -> tuple[SparseTable, SparseTable]:
    config = TableConfig(name="t", dim=DIM, rule=optim.Adam(lr=0.01), seed=3,
                         lifecycle=Lifecycle(admission="count", admit_count=2))  # fmt: skip
    tiered = dataclasses.replace(config, memory_rows=100)
    memory, disk = SparseTable(config), SparseTable(tiered, disk_dir=str(tmp_path))
    rng = np.random.default_rng(5)
    for _ in range(60):  # a key is admitted at its second show: some stay pending
        keys = rng.choice(POOL, 400)
        grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
        clicks = (rng.random(len(keys)) < 0.2).astype(np.float32)
        for table in (memory, disk):
            table.push(keys, grads, clicks=clicks)
    return memory, disk


def _sorted(columns: dict) -> dict:
    order = np.argsort(columns["key"], kind="stable")
    return {name: np.asarray(values)[order] for name, values in columns.items()}


def _assert_same(got: tuple[dict, dict], want: tuple[dict, dict]) -> None:
    for kind, mine, theirs in zip(("rows", "pending"), got, want, strict=True):
        mine, theirs = _sorted(mine), _sorted(theirs)
        assert mine.keys() == theirs.keys(), kind
        for name in theirs:
            np.testing.assert_array_equal(mine[name], theirs[name], err_msg=f"{kind} {name}")


def _refuse(*_args, **_kwargs):
    raise AssertionError("the other way of reading the disk copies was taken")


@pytest.mark.parametrize("share", ["few", "most"])
def test_a_tiered_tables_export_of_some_keys_equals_the_in_memory_tables(
    tmp_path, monkeypatch, share
):
    memory, disk = _pair(tmp_path)
    rows = memory.keys()
    assert len(rows) > 4000 and len(memory.export_pending()["key"]) > 0
    rng = np.random.default_rng(9)
    pick = rows[rng.choice(len(rows), 12 if share == "few" else len(rows) // 2, replace=False)]
    pending = memory.export_pending()["key"][:5]
    absent = np.array([7, 11], np.uint64)  # neither rows nor pending: skipped
    keys = np.unique(np.concatenate([pick, pending, absent]))
    # rows changed after the last write to disk: the export must see them
    fresh = rng.standard_normal((len(pick[:8]), DIM)).astype(np.float32)
    for table in (memory, disk):
        table.push(pick[:8], fresh)
    # a few keys are read where they are, most of the table in one pass over the file
    tier = disk._storage.tier
    monkeypatch.setattr(tier, "scan" if share == "few" else "locate", _refuse)
    got = disk.export_keys(keys)
    assert len(got[0]["key"]) == len(pick) and len(got[1]["key"]) == len(pending)
    _assert_same(got, memory.export_keys(keys))
    # the export changed nothing: the tables still agree on every row
    monkeypatch.undo()
    _assert_same((disk.export_rows(), disk.export_pending()),
                 (memory.export_rows(), memory.export_pending()))  # fmt: skip
    disk.close()
