"""Issue 28: a push applies whole or not at all, even when it fails half-way through.

A failure is injected in the middle of the in-place apply through the table's explicit
test hook (:class:`sparseps.table.push.PushHooks`; nothing is patched): the table must
then be byte-identical to before (sha256 of every exported row and pending counter,
sorted by key), and the same push without the failure must give exactly what a twin
table that never failed gives. The issue's mixed FTRL push is also run against a real
server, reading the rows back.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Initializer, Lifecycle, TableConfig
from sparseps.table import DenseTable, SparseTable
from sparseps.table.push import PushHooks

DIM = 4
RULES = {
    "sgd": optim.SGD(lr=0.5, l2=0.01),
    "adagrad": optim.Adagrad(lr=0.1),
    "rowwise_adagrad": optim.RowwiseAdagrad(lr=0.1),
    "adam": optim.Adam(lr=0.01),
    "ftrl": optim.FTRL(alpha=0.1, beta=0.0),
}


class Injected(RuntimeError):
    pass


class FailMidApply(PushHooks):
    """Raises ``error`` in the middle of the apply while armed; records where it was."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.armed = False
        self.calls: list[tuple[str, str, int, int]] = []

    def mid_apply(self, op: str, table: str, done: int, total: int) -> None:
        self.calls.append((op, table, done, total))
        if self.armed:
            raise self.error


def _table(rule, hooks=None) -> SparseTable:
    config = TableConfig(
        name="emb", dim=DIM, rule=rule, initializer=Initializer.uniform(-0.1, 0.1), seed=5,
        lifecycle=Lifecycle(admission="count", admit_count=2),
    )  # fmt: skip
    return SparseTable(config, hooks=hooks)


def checksum(table: SparseTable) -> str:
    """sha256 over every exported column of the rows and pending keys, sorted by key."""
    digest = hashlib.sha256()
    for columns in (table.export_rows(), table.export_pending()):
        order = np.argsort(columns["key"])
        for name in sorted(columns):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(columns[name][order]).tobytes())
    return digest.hexdigest()


def _history(table: SparseTable, rng) -> None:
    """Rows (admitted on their 2nd push), a pending key, a few updates."""
    rows = np.arange(1, 41, dtype=np.uint64)
    for _ in range(3):
        table.push(rows, rng.normal(0, 1, (rows.size, DIM)).astype(np.float32))
    table.push(np.array([100, 101], np.uint64), np.ones((2, DIM), np.float32))  # pending


def _batch(rng):
    """Existing rows (with repeats), keys admitted now (100), kept pending (102)."""
    keys = np.concatenate([np.arange(1, 41, dtype=np.uint64), [3, 7, 100, 102]]).astype(np.uint64)
    grads = rng.normal(0, 1, (keys.size, DIM)).astype(np.float32)
    return keys, grads, rng.uniform(0, 2, keys.size).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "op"), [(name, "push") for name in sorted(RULES)] + [("sgd", "push_delta")]
)
@pytest.mark.parametrize("error", [Injected("injected"), MemoryError("injected")])
def test_failure_mid_apply_leaves_the_table_byte_identical(name, op, error):
    hooks = FailMidApply(error)
    table, twin = _table(RULES[name], hooks), _table(RULES[name])
    for t in (table, twin):
        _history(t, np.random.default_rng(0))
    assert checksum(table) == checksum(twin)
    before = checksum(table)
    keys, grads, shows = _batch(np.random.default_rng(1))
    hooks.armed = True
    with pytest.raises(type(error), match="injected"):
        getattr(table, op)(keys, grads, shows=shows)
    op_, table_name, done, total = hooks.calls[-1]
    assert (op_, table_name) == (op, "emb") and 0 < done < total  # really half-way
    assert checksum(table) == before
    assert len(table) == 40 and table.stats().pending == 2
    # the failed push left nothing behind: the same push now gives the twin's result
    hooks.armed = False
    getattr(table, op)(keys, grads, shows=shows)
    getattr(twin, op)(keys, grads, shows=shows)
    assert checksum(table) == checksum(twin) != before
    assert len(table) == 41


@pytest.mark.parametrize("rule", [optim.SGD(lr=0.1), optim.Adagrad(), optim.Adam()])
def test_dense_failure_mid_apply_leaves_the_table_unchanged(rule):
    hooks = FailMidApply(Injected("injected"))
    dense = DenseTable("head", 5, rule=rule, hooks=hooks)
    dense.push(np.arange(5, dtype=np.float32))
    before = dense.export()
    hooks.armed = True
    for op in ("push", "add"):
        with pytest.raises(Injected):
            getattr(dense, op)(np.ones(5, np.float32))
        after = dense.export()
        assert all(after[k].tobytes() == before[k].tobytes() for k in before)
    hooks.armed = False
    dense.push(np.ones(5, np.float32))
    assert dense.export()["values"].tobytes() != before["values"].tobytes()


def test_issue_mixed_ftrl_push_on_a_real_server():
    """The issue's repro through a server: the mixed push succeeds, rows read back are
    finite and bit-equal to a local table given the same pushes."""
    from sparseps.testing import local_cluster

    config = TableConfig(name="w", dim=1, rule=optim.FTRL(alpha=0.1, beta=0.0),
                         initializer=Initializer.zeros())  # fmt: skip
    pushes = [
        (np.array([1, 2], np.uint64), np.array([[0.5], [0.5]], np.float32)),
        (np.array([1, 20, 2], np.uint64), np.array([[0.1], [1e-30], [0.1]], np.float32)),
        (np.array([20, 21], np.uint64), np.array([[0.0], [1e-45]], np.float32)),
    ]
    local = SparseTable(config)
    keys = np.array([1, 2, 20, 21], np.uint64)
    with local_cluster(servers=1) as cluster, cluster.client() as client:
        client.create_table(config)
        for k, g in pushes:
            client.push("w", k, g).wait()
            local.push(k, g)
        rows = client.pull("w", keys).wait()
    assert np.isfinite(rows).all()
    assert rows.tobytes() == local.pull(keys).tobytes()
    assert rows[0, 0] == rows[1, 0] < 0 and rows[2, 0] == rows[3, 0] == 0.0


class _NanRule(optim.SGD):
    """A rule that does not vouch for its results (returns None) and writes a NaN."""

    def update(self, storage, rows, grads, dim):
        storage[rows[-1], 0] = np.nan


def test_rule_that_does_not_check_is_checked_by_the_table():
    table = _table(_NanRule(lr=0.1))
    keys = np.arange(1, 6, dtype=np.uint64)
    ones = np.ones((keys.size, DIM), np.float32)
    table.import_rows({
        "key": keys, "embedding": ones, "state": np.zeros((keys.size, 0), np.float32),
        "show": np.ones(5, np.float32), "click": np.zeros(5, np.float32),
        "delta_score": np.zeros(5, np.float32), "unseen_days": np.zeros(5, np.int32),
    })  # fmt: skip
    before = checksum(table)
    with pytest.raises(Exception, match="non-finite"):
        table.push(keys, ones)
    assert checksum(table) == before


def test_counters_near_their_limit_saturate():
    table = _table(optim.Adagrad())
    keys = np.array([1, 2], np.uint64)
    big = np.float32(3e38)
    table.import_rows({
        "key": keys, "embedding": np.zeros((2, DIM), np.float32),
        "state": np.zeros((2, DIM), np.float32), "show": np.full(2, big),
        "click": np.full(2, big), "delta_score": np.full(2, big),
        "unseen_days": np.zeros(2, np.int32),
    })  # fmt: skip
    table.push(keys, np.ones((2, DIM), np.float32), shows=np.full(2, big), clicks=np.full(2, big))
    rows = table.export_rows()
    for name in ("show", "click", "delta_score"):
        assert (rows[name] == np.finfo(np.float32).max).all(), name
