"""Optimizer rules applied through a SparseTable against independent oracles.

Each row of the table is mirrored by its own ``torch.nn.Parameter``; a step sets
``.grad`` to the merged (summed) gradient of the rows the batch touched and ``None``
elsewhere, so torch leaves untouched rows and their state alone, exactly the lazy
per-row semantics of the table. Row-wise Adagrad and FTRL have no torch counterpart and
use the plain numpy references below, written from the papers' formulas.

Tolerances (float32 arithmetic on both sides, 6 steps): SGD/Adagrad/RowwiseAdagrad/FTRL
rtol 1e-5, atol 1e-6; Adam rtol 1e-4, atol 1e-6 (its first steps divide by sqrt(v) ~ |g|,
which amplifies last-bit differences).
"""

import numpy as np
import pytest
import torch

from sparseps import optim
from sparseps.config import Initializer, TableConfig
from sparseps.table import DenseTable, SparseTable

DIM = 4
STEPS = 6
KEYS = np.array([0, 2**64 - 1, 7, 123456789, 2**63, 42, 99, 5, 11, 13], np.uint64)


def _batches(seed: int):
    """STEPS batches over the first 7 keys, with repeats; keys 7..9 are never pushed."""
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        picks = rng.integers(0, 7, size=12)
        grads = rng.normal(0, 1, size=(12, DIM)).astype(np.float32)
        yield picks, grads


def _merged(picks, grads):
    merged = {}
    for p, g in zip(picks, grads, strict=True):
        merged[p] = merged.get(p, np.zeros(DIM, np.float32)) + g
    return merged


def _torch_oracle(make_optimizer, initial, clip=None, seed=0):
    params = [torch.nn.Parameter(torch.tensor(row)) for row in initial]
    opt = make_optimizer(params)
    history = []
    for picks, grads in _batches(seed):
        merged = _merged(picks, grads)
        for i, p in enumerate(params):
            p.grad = torch.tensor(merged[i]) if i in merged else None
        opt.step()
        if clip is not None:
            with torch.no_grad():
                for i in merged:
                    params[i].clamp_(*clip)
        history.append(np.stack([p.detach().numpy().copy() for p in params]))
    return history


def _table_run(rule, seed=0):
    table = SparseTable(
        TableConfig(name="t", dim=DIM, rule=rule, initializer=Initializer.uniform(-1, 1), seed=3)
    )
    initial = table.pull(KEYS)
    # create every row (including the never-pushed ones) with its initial value
    history = []
    for picks, grads in _batches(seed):
        table.push(np.ascontiguousarray(KEYS[picks]), grads)
        history.append(table.pull(KEYS))
    return initial, history, table


CASES = {
    "sgd": (optim.SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1), None),
    "sgd_l2_clip": (
        optim.SGD(lr=0.3, l2=0.1, clip=(-0.5, 0.5)),
        lambda p: torch.optim.SGD(p, lr=0.3, weight_decay=0.1),
        (-0.5, 0.5),
    ),
    "adagrad": (
        optim.Adagrad(lr=0.05, initial_accumulator=0.1),
        lambda p: torch.optim.Adagrad(p, lr=0.05, initial_accumulator_value=0.1, eps=1e-10),
        None,
    ),
    "adagrad_l2_clip": (
        optim.Adagrad(lr=0.2, l2=0.05, clip=(-0.8, 0.6)),
        lambda p: torch.optim.Adagrad(p, lr=0.2, weight_decay=0.05, eps=1e-10),
        (-0.8, 0.6),
    ),
    "adam": (
        optim.Adam(lr=0.01),
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.999), eps=1e-8),
        None,
    ),
    "adam_l2_clip": (
        optim.Adam(lr=0.05, beta1=0.8, beta2=0.99, l2=0.01, clip=(-0.9, 0.9)),
        lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.01),
        (-0.9, 0.9),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_torch_on_touched_rows(case):
    rule, make_optimizer, clip = CASES[case]
    initial, history, table = _table_run(rule)
    expected = _torch_oracle(make_optimizer, initial, clip)
    rtol = 1e-4 if "adam" in case else 1e-5
    for step, (got, want) in enumerate(zip(history, expected, strict=True)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6, err_msg=f"{case} step {step}")
    # rows 7..9 were never pushed: still exactly their initial values, and never created
    np.testing.assert_array_equal(history[-1][7:], initial[7:])
    assert len(table) == 7
    if clip is not None:
        assert history[-1][:7].min() >= clip[0] and history[-1][:7].max() <= clip[1]


def test_adam_step_counter_is_per_row():
    table = SparseTable(TableConfig(name="t", dim=2, rule=optim.Adam(lr=0.1)))
    a, b = np.array([1], np.uint64), np.array([2], np.uint64)
    for _ in range(3):
        table.push(a, np.ones((1, 2), np.float32))
    table.push(b, np.ones((1, 2), np.float32))
    rows = table.export_rows()
    steps = dict(zip(rows["key"].tolist(), rows["state"][:, -1].tolist(), strict=True))
    assert steps == {1: 3.0, 2: 1.0}


def _numpy_reference(kind, params, initial, clip=None):
    w = initial.astype(np.float64).copy()
    if kind == "rowwise":
        lr, eps, l2 = params
        acc = np.zeros(len(w))
    else:
        alpha, beta, l1, l2 = params
        z = np.zeros_like(w)
        n = np.zeros_like(w)
    history = []
    for picks, grads in _batches(1):
        for i, g in _merged(picks, grads).items():
            g = g.astype(np.float64)
            if kind == "rowwise":
                g = g + l2 * w[i]
                acc[i] += np.mean(g * g)
                w[i] = w[i] - lr * g / (np.sqrt(acc[i]) + eps)
            else:
                sigma = (np.sqrt(n[i] + g * g) - np.sqrt(n[i])) / alpha
                z[i] += g - sigma * w[i]
                n[i] += g * g
                shrunk = np.where(np.abs(z[i]) <= l1, 0.0, -(z[i] - np.sign(z[i]) * l1))
                w[i] = shrunk / ((beta + np.sqrt(n[i])) / alpha + l2)
            if clip is not None:
                w[i] = np.clip(w[i], *clip)
        history.append(w.copy())
    return history


@pytest.mark.parametrize(
    ("kind", "rule", "params"),
    [
        ("rowwise", optim.RowwiseAdagrad(lr=0.1, eps=1e-10), (0.1, 1e-10, 0.0)),
        ("rowwise", optim.RowwiseAdagrad(lr=0.2, eps=1e-8, l2=0.05), (0.2, 1e-8, 0.05)),
        ("ftrl", optim.FTRL(alpha=0.1, beta=1.0, l1=0.0, l2=0.0), (0.1, 1.0, 0.0, 0.0)),
        ("ftrl", optim.FTRL(alpha=0.5, beta=0.5, l1=0.3, l2=0.2), (0.5, 0.5, 0.3, 0.2)),
        # Bounds tight enough that most updated weights hit one (checked below).
        (
            "rowwise",
            optim.RowwiseAdagrad(lr=0.5, eps=1e-8, l2=0.05, clip=(-0.3, 0.2)),
            (0.5, 1e-8, 0.05),
        ),
        ("ftrl", optim.FTRL(alpha=2.0, beta=0.1, clip=(-0.05, 0.1)), (2.0, 0.1, 0.0, 0.0)),
    ],
)
def test_rule_matches_numpy_reference(kind, rule, params):
    table = SparseTable(
        TableConfig(name="t", dim=DIM, rule=rule, initializer=Initializer.uniform(-1, 1))
    )
    initial = table.pull(KEYS)
    expected = _numpy_reference(kind, params, initial, rule.clip)
    if rule.clip is not None:  # the bounds matter: without them the result differs
        unclipped = _numpy_reference(kind, params, initial)
        assert np.abs(unclipped[-1][:7] - expected[-1][:7]).max() > 0.05
    for step, (picks, grads) in enumerate(_batches(1)):
        table.push(np.ascontiguousarray(KEYS[picks]), grads)
        np.testing.assert_allclose(
            table.pull(KEYS), expected[step], rtol=1e-5, atol=1e-6, err_msg=f"step {step}"
        )
    np.testing.assert_array_equal(table.pull(KEYS)[7:], initial[7:])


def test_ftrl_l1_gives_exact_zeros():
    table = SparseTable(
        TableConfig(
            name="t", dim=3, rule=optim.FTRL(alpha=0.1, l1=10.0), initializer=Initializer.zeros()
        )
    )
    keys = np.arange(50, dtype=np.uint64)
    table.push(keys, np.full((50, 3), 0.5, np.float32))
    assert not table.pull(keys).any()


@pytest.mark.parametrize(
    ("rule", "make"),
    [
        (optim.SGD(lr=0.1, l2=0.01), lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01)),
        (optim.Adagrad(lr=0.1), lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10)),
        (optim.Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ],
)
def test_dense_table_matches_torch(rule, make):
    rng = np.random.default_rng(5)
    init = rng.normal(size=33).astype(np.float32)
    table = DenseTable("dense", 33, rule=rule, init=init)
    param = torch.nn.Parameter(torch.tensor(init))
    opt = make([param])
    for _ in range(5):
        grad = rng.normal(size=33).astype(np.float32)
        table.push(grad)
        param.grad = torch.tensor(grad)
        opt.step()
    np.testing.assert_allclose(table.pull(), param.detach().numpy(), rtol=1e-5, atol=1e-6)
    # export/import is bit-exact, and add/set behave as documented
    copy = DenseTable("dense", 33, rule=rule)
    copy.import_(table.export())
    assert all(
        np.array_equal(a, b)
        for a, b in zip(copy.export().values(), table.export().values(), strict=True)
    )
    copy.add(np.ones(33, np.float32))
    np.testing.assert_array_equal(copy.pull(), table.pull() + np.float32(1))
    copy.set(np.zeros(33, np.float32))
    assert not copy.pull().any()
