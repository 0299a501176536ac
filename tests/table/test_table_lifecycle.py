"""Admission, decay and shrink pinned with hand-computed values."""

import numpy as np

from sparseps import optim
from sparseps.config import Initializer, Lifecycle, TableConfig
from sparseps.table import SparseTable

K = np.uint64


def _table(lifecycle, dim=2, seed=0):
    config = TableConfig(name="t", dim=dim, rule=optim.SGD(lr=0.5), initializer=Initializer.constant(1.0),
                         lifecycle=lifecycle, seed=seed)  # fmt: skip
    return SparseTable(config)


def _keys(*keys):
    return np.array(keys, np.uint64)


def _f32(*rows):
    return np.array(rows, np.float32)


def _row(table, key):
    rows = table.export_rows()
    i = int(np.flatnonzero(rows["key"] == K(key))[0])
    return {name: values[i] for name, values in rows.items()}


def test_count_admission():
    table = _table(Lifecycle(admission="count", admit_count=3))
    key = _keys(5)
    table.push(key, _f32([1, 1]), clicks=_f32(1))  # show 1: pending, gradient dropped
    assert len(table) == 0 and table.stats().pending == 1
    np.testing.assert_array_equal(table.pull(key), [[0, 0]])  # not admitted: zeros
    pending = table.export_pending()
    assert (
        pending["key"].tolist() == [5]
        and pending["show"].tolist() == [1]
        and pending["click"].tolist() == [1]
    )
    table.push(key, _f32([1, 1]))  # show 2: still pending
    assert len(table) == 0
    table.push(key, _f32([2, -2]))  # show 3: admitted, row = init 1.0 - 0.5 * grad
    np.testing.assert_array_equal(table.pull(key), [[0.0, 2.0]])
    row = _row(table, 5)
    assert (row["show"], row["click"]) == (3.0, 1.0)
    assert np.isclose(row["delta_score"], (3 - 1) * 0.1 + 1 * 1.0)  # 1.2
    assert table.stats().pending == 0 and table.export_pending()["key"].size == 0
    # repeats inside one push count: three occurrences admit at once, merged gradient applied
    table.push(_keys(6, 6, 6), _f32([1, 0], [1, 0], [0, 2]))
    np.testing.assert_array_equal(table.pull(_keys(6)), [[0.0, 0.0]])  # 1 - 0.5 * [2, 2]


def test_score_admission():
    table = _table(
        Lifecycle(admission="score", admit_score=1.5, nonclick_coeff=0.1, click_coeff=1.0)
    )
    key = _keys(9)
    table.push(key, _f32([1, 1]), shows=_f32(1), clicks=_f32(1))  # score 0*0.1 + 1 = 1.0
    assert len(table) == 0
    table.push(key, _f32([1, 1]), shows=_f32(5), clicks=_f32(0))  # (6-1)*0.1 + 1 = 1.5
    assert len(table) == 1
    row = _row(table, 9)
    assert (row["show"], row["click"]) == (6.0, 1.0)
    np.testing.assert_array_equal(row["embedding"], [0.5, 0.5])


def test_probability_admission_is_deterministic_and_calibrated():
    keys = np.arange(1, 20001, dtype=np.uint64)
    policy = Lifecycle(admission="probability", admit_probability=0.3)
    grads = np.zeros((keys.size, 2), np.float32)
    table = _table(policy, seed=7)
    table.push(keys, grads)
    first = table.contains(keys)
    # binomial(20000, 0.3): mean 6000, sd ~65
    assert abs(first.sum() - 6000) < 300
    # every shard layout and every replay makes the same decision per key
    for s in range(4):
        shard = _table(policy, seed=7)
        mine = np.ascontiguousarray(keys[keys % 4 == s])
        shard.push(mine, grads[: mine.size])
        np.testing.assert_array_equal(shard.contains(mine), first[keys % 4 == s])
    other_seed = _table(policy, seed=8)
    other_seed.push(keys, grads)
    assert (other_seed.contains(keys) != first).mean() > 0.3
    # each later push is a fresh draw: after 2 pushes about 1 - 0.7**2 = 51% are rows
    table.push(keys, grads)
    assert abs(table.contains(keys).mean() - 0.51) < 0.015
    assert table.contains(keys)[first].all()
    assert len(table) + table.stats().pending == keys.size


def test_always_admission_creates_rows_on_first_push():
    table = _table(Lifecycle())
    np.testing.assert_array_equal(table.pull(_keys(3)), [[1.0, 1.0]])  # initial value, no row
    assert len(table) == 0
    table.push(_keys(3), _f32([1, 1]))
    np.testing.assert_array_equal(table.pull(_keys(3)), [[0.5, 0.5]])
    assert table.stats().pending == 0


def test_decay():
    table = _table(Lifecycle())
    table.push(_keys(1, 2), np.zeros((2, 2), np.float32), shows=_f32(10, 4), clicks=_f32(2, 0))
    table.decay(0.5)
    r1, r2 = _row(table, 1), _row(table, 2)
    assert (r1["show"], r1["click"], r2["show"], r2["click"]) == (5.0, 1.0, 2.0, 0.0)
    assert (r1["unseen_days"], r2["unseen_days"]) == (0, 0)  # both pushed since last decay
    table.push(_keys(1), np.zeros((1, 2), np.float32))  # key 1 seen on day 2, key 2 not
    table.decay(0.5)
    r1, r2 = _row(table, 1), _row(table, 2)
    assert (r1["show"], r2["show"]) == (3.0, 1.0)
    assert (r1["unseen_days"], r2["unseen_days"]) == (0, 1)
    table.decay()  # default rate 0.98
    r1, r2 = _row(table, 1), _row(table, 2)
    assert (r1["unseen_days"], r2["unseen_days"]) == (1, 2)
    assert r1["show"] == np.float32(3.0) * np.float32(0.98)
    # a push resets unseen days
    table.push(_keys(2), np.zeros((1, 2), np.float32))
    assert _row(table, 2)["unseen_days"] == 0


def test_shrink():
    policy = Lifecycle(shrink_score=0.5, shrink_unseen_days=1, nonclick_coeff=0.1, click_coeff=1.0)
    table = _table(policy)
    a, b, c = 7, 2**64 - 1, 0
    zeros = np.zeros((3, 2), np.float32)
    table.push(_keys(a, b, c), zeros, shows=_f32(10, 2, 1), clicks=_f32(0, 0, 1))
    table.decay(1.0)  # unseen: a 0, b 0, c 0
    table.push(_keys(a), zeros[:1], shows=_f32(0))
    table.decay(1.0)  # a 0, b 1, c 1
    table.decay(1.0)  # a 1, b 2, c 2
    # scores: a 10*0.1 = 1.0 (unseen 1, kept); b 2*0.1 = 0.2 < 0.5; c 0*0.1 + 1 = 1.0 but unseen 2 > 1
    deleted = table.shrink()
    assert deleted.dtype == np.uint64 and deleted.tolist() == [0, 2**64 - 1]
    assert table.keys().tolist() == [7] and len(table) == 1
    assert table.shrink().size == 0


def test_shrink_forgets_stale_pending_keys():
    table = _table(Lifecycle(admission="count", admit_count=5, shrink_unseen_days=0))
    table.push(_keys(1, 2), np.zeros((2, 2), np.float32))
    table.decay()
    table.push(_keys(2), np.zeros((1, 2), np.float32))
    table.decay()  # pending key 1 unseen 1 day, key 2 0 days
    assert table.shrink().size == 0  # pending keys are not rows: nothing reported
    pending = table.export_pending()
    assert pending["key"].tolist() == [2] and pending["show"].tolist() == [
        np.float32(0.98 * 0.98 + 0.98)
    ]
