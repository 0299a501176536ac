"""Bad input gets a clear InputError / ConfigError and leaves the table unchanged."""

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Initializer, Lifecycle, TableConfig
from sparseps.errors import ConfigError, InputError
from sparseps.table import DenseTable, SparseTable


@pytest.fixture
def table():
    t = SparseTable(TableConfig(name="t", dim=4, rule=optim.Adagrad()))
    t.push(np.arange(10, dtype=np.uint64), np.ones((10, 4), np.float32))
    return t


def _snapshot(table):
    rows = table.export_rows()
    order = np.argsort(rows["key"])
    return {k: v[order] for k, v in rows.items()}


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_wrong_key_dtype(table):
    with pytest.raises(InputError, match=r"pull: keys must be .*uint64.*found dtype int64"):
        table.pull(np.arange(3))
    with pytest.raises(InputError, match=r"push: keys .*found a list"):
        table.push([1, 2], np.ones((2, 4), np.float32))


def test_wrong_grad_dtype_and_shape(table):
    keys = np.arange(3, dtype=np.uint64)
    with pytest.raises(InputError, match=r"push: grads must be .*float32.*found dtype float64"):
        table.push(keys, np.ones((3, 4)))
    with pytest.raises(InputError, match=r"shape \(3, 4\).*found dtype float32, shape \(3, 5\)"):
        table.push(keys, np.ones((3, 5), np.float32))
    with pytest.raises(InputError, match=r"shape \(3, 4\).*shape \(2, 4\)"):
        table.push(keys, np.ones((2, 4), np.float32))
    with pytest.raises(InputError, match=r"keys must be .*1-D.*shape \(3, 1\)"):
        table.pull(keys.reshape(3, 1))
    with pytest.raises(InputError, match=r"shows must be .*length 3"):
        table.push(keys, np.ones((3, 4), np.float32), shows=np.ones(2, np.float32))
    with pytest.raises(InputError, match=r"clicks must be finite and >= 0"):
        table.push(keys, np.ones((3, 4), np.float32), clicks=np.array([0, -1, 0], np.float32))


def test_non_contiguous(table):
    keys = np.arange(20, dtype=np.uint64)[::2]
    with pytest.raises(InputError, match=r"keys must be a C-contiguous.*non-contiguous"):
        table.pull(keys)
    grads = np.ones((10, 8), np.float32)[:, ::2]  # shape (10, 4), strided
    with pytest.raises(InputError, match=r"grads must be a C-contiguous.*non-contiguous"):
        table.push(np.arange(10, dtype=np.uint64), grads)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_inf_gradients_reject_the_whole_push(table, bad):
    before = _snapshot(table)
    keys = np.array([3, 100, 4, 5], np.uint64)
    grads = np.ones((4, 4), np.float32)
    grads[2, 1] = bad
    grads[3, 0] = bad
    with pytest.raises(
        InputError, match=r"2 NaN/inf value\(s\) in 2 row\(s\), first at key 4 \(position 2\)"
    ):
        table.push(keys, grads)
    assert _same(before, _snapshot(table)) and len(table) == 10  # key 100 was not created
    with pytest.raises(InputError, match="NaN/inf"):
        table.push_delta(keys, grads)


def test_import_validation(table):
    rows = table.export_rows()
    wrong_dim = dict(rows, embedding=np.ones((rows["key"].size, 5), np.float32))
    with pytest.raises(
        InputError,
        match=r"import_rows: columns\['embedding'\] must be .*shape \(10, 4\).*\(10, 5\)",
    ):
        table.import_rows(wrong_dim)
    with pytest.raises(InputError, match=r"missing \['state'\]"):
        table.import_rows({k: v for k, v in rows.items() if k != "state"})
    with pytest.raises(InputError, match=r"unknown \['extra'\]"):
        table.import_rows(dict(rows, extra=rows["show"]))
    with pytest.raises(
        InputError, match=r"columns\['unseen_days'\] must be .*int32.*found dtype int64"
    ):
        table.import_rows(dict(rows, unseen_days=rows["unseen_days"].astype(np.int64)))
    dup = {k: np.ascontiguousarray(np.concatenate([v, v[:1]])) for k, v in rows.items()}
    with pytest.raises(InputError, match="repeated keys"):
        table.import_rows(dup)
    nan = dict(rows, embedding=np.full_like(rows["embedding"], np.nan))
    with pytest.raises(InputError, match="NaN/inf"):
        table.import_rows(nan)
    with pytest.raises(InputError, match=r"import_pending: columns must be"):
        table.import_pending({"key": rows["key"]})


def test_decay_rate_validation(table):
    with pytest.raises(InputError, match=r"decay: rate must be a number in \(0, 1\]"):
        table.decay(1.5)


def test_dense_inputs():
    dense = DenseTable("d", 3, rule=optim.SGD())
    with pytest.raises(
        InputError, match=r"d.push: values must be .*float32 array of length 3.*float64"
    ):
        dense.push(np.ones(3))
    with pytest.raises(InputError, match="NaN/inf"):
        dense.push(np.array([0, np.nan, 0], np.float32))
    with pytest.raises(ConfigError, match="expected one of"):
        DenseTable("d", 3, rule=optim.FTRL())
    with pytest.raises(InputError, match=r"init must be .*shape \(3,\)"):
        DenseTable("d", 3, init=np.ones(4))


def test_config_validation_names_field_value_and_range():
    with pytest.raises(
        ConfigError, match=r"TableConfig.dim: got 0, expected an integer in \[1, 65536\]"
    ):
        TableConfig(name="t", dim=0)
    with pytest.raises(ConfigError, match=r"TableConfig.name"):
        TableConfig(name="bad name/", dim=4)
    with pytest.raises(ConfigError, match=r"Adagrad.lr: got -1, expected a finite number > 0"):
        optim.Adagrad(lr=-1)
    with pytest.raises(ConfigError, match=r"Adam.beta1: got 1.0"):
        optim.Adam(beta1=1.0)
    with pytest.raises(ConfigError, match=r"SGD.clip: min_bound 1.0 must be < max_bound -1.0"):
        optim.SGD(clip=(1, -1))
    with pytest.raises(ConfigError, match=r"Lifecycle.admission: got 'sometimes', expected one of"):
        Lifecycle(admission="sometimes")
    with pytest.raises(ConfigError, match=r"Lifecycle.admit_probability: got 0"):
        Lifecycle(admit_probability=0)
    with pytest.raises(ConfigError, match=r"Initializer.uniform: low=1.0 must be < high=0.0"):
        Initializer.uniform(1, 0)
    with pytest.raises(ConfigError, match=r"TableConfig.rule"):
        TableConfig(name="t", dim=4, rule="adagrad")


def test_config_dict_round_trip_and_unknown_keys():
    import json

    import msgpack

    config = TableConfig(
        name="emb.v1", dim=16, rule=optim.FTRL(alpha=0.1, l1=0.5, clip=(-2, 2)),
        initializer=Initializer.normal(0, 0.01),
        lifecycle=Lifecycle(admission="score", admit_score=2.0, shrink_unseen_days=7), seed=2**64 - 1,
    )  # fmt: skip
    d = config.to_dict()
    assert TableConfig.from_dict(msgpack.unpackb(msgpack.packb(d))) == config
    assert TableConfig.from_dict(json.loads(json.dumps(d))) == config
    for rule in (optim.SGD(), optim.Adagrad(), optim.RowwiseAdagrad(), optim.Adam(), optim.FTRL()):
        assert optim.rule_from_dict(rule.to_dict()) == rule
    with pytest.raises(ConfigError, match=r"TableConfig: unknown key\(s\) \['colour'\]"):
        TableConfig.from_dict(dict(d, colour="red"))
    with pytest.raises(ConfigError, match=r"FTRL: unknown key\(s\) \['lr'\]"):
        TableConfig.from_dict(dict(d, rule=dict(d["rule"], lr=0.1)))
    with pytest.raises(ConfigError, match=r"unknown name 'rmsprop'"):
        optim.rule_from_dict({"name": "rmsprop"})
    with pytest.raises(ConfigError, match=r"Lifecycle: unknown key"):
        TableConfig.from_dict(dict(d, lifecycle={"admision": "count"}))


def test_numpy_scalars_are_accepted_and_normalised():
    import msgpack

    config = TableConfig(
        name="t", dim=np.int64(4), rule=optim.Adam(lr=np.float32(0.5)), seed=np.uint64(2**64 - 1)
    )
    assert type(config.dim) is int and type(config.seed) is int and type(config.rule.lr) is float
    assert TableConfig.from_dict(msgpack.unpackb(msgpack.packb(config.to_dict()))) == config
    with pytest.raises(ConfigError, match=r"TableConfig.dim: expected an integer, got 4.0"):
        TableConfig(name="t", dim=4.0)
    with pytest.raises(ConfigError, match=r"SGD.lr: expected a number, got True"):
        optim.SGD(lr=True)


def test_pull_into_out(table):
    """A server gathers a same-host client's rows straight into its reply slot: ``out``."""
    keys = np.array([3, 99, 1], np.uint64)  # 99 was never pushed: its initial value
    out = np.full((3, 4), 7.0, np.float32)
    assert table.pull(keys, out=out) is out
    assert np.array_equal(out, table.pull(keys))
    for bad in (
        np.empty((2, 4), np.float32),
        np.empty((3, 4), np.float64),
        np.empty((4, 3), np.float32).T,
    ):
        with pytest.raises(InputError, match="pull: out must be"):
            table.pull(keys, out=bad)
    frozen = np.empty((3, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(InputError, match="out must be writable"):
        table.pull(keys, out=frozen)
