"""The device rules (torch kernels of GPUPS) against the servers' numba kernels.

Same rows, state and gradients, 30 steps over random unique row subsets, each rule with
its options on (l2, clip, FTRL's l1): the device result must equal the server's to the
float32 bit. Extreme inputs (gradients near float32's max, a negative stored
accumulator) must give the same saturated, finite values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparseps import optim
from sparseps.errors import ConfigError
from sparseps.optim.device_rules import DEVICE_RULES, apply_rule, check_device_rule

DIM = 5
RULES = [
    optim.SGD(lr=0.1, l2=0.01, clip=(-0.3, 0.3)),
    optim.Adagrad(lr=0.1, l2=0.01, initial_accumulator=0.1),
    optim.RowwiseAdagrad(lr=0.1, l2=0.01, clip=(-1.0, 1.0)),
    optim.Adam(lr=0.01, eps=1e-4, l2=0.01),
    optim.FTRL(alpha=0.05, beta=1.0, l1=0.05, l2=0.01),
    optim.FTRL(alpha=0.05, beta=0.0, l1=0.0, l2=0.0),  # the guarded zero denominator
    optim.SparseAdagrad(lr=0.1, initial_g2sum=3.0, l2=0.01, clip=(-1.0, 1.0)),
]
IDS = [f"{rule.name}-{i}" for i, rule in enumerate(RULES)]


def _start(rule, rows: int, rng) -> np.ndarray:
    storage = np.zeros((rows, DIM + rule.state_dim(DIM)), np.float32)
    storage[:, :DIM] = rng.normal(0.0, 0.2, (rows, DIM))
    storage[:, DIM:] = rule.initial_state(DIM)
    return storage


def _device_run(rule, storage: np.ndarray, steps) -> np.ndarray:
    weights = torch.from_numpy(storage[:, :DIM].copy())
    state = torch.from_numpy(storage[:, DIM:].copy())
    for rows, grads in steps:
        apply_rule(rule, weights, state, torch.from_numpy(rows), torch.from_numpy(grads))
    return np.concatenate([weights.numpy(), state.numpy()], axis=1)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_device_rule_equals_the_server_rule_bit_for_bit(rule):
    rng = np.random.default_rng(7)
    server = _start(rule, 60, rng)
    start = server.copy()
    steps = []
    for _ in range(30):
        rows = np.unique(rng.integers(0, 60, 25)).astype(np.int64)
        grads = rng.normal(0.0, 1.0, (rows.size, DIM)).astype(np.float32)
        steps.append((rows, grads))
        assert rule.update(server, rows, grads, DIM)
    device = _device_run(rule, start, steps)
    np.testing.assert_array_equal(device, server)
    assert not np.array_equal(server[:, :DIM], start[:, :DIM])  # the rule moved the rows


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_device_rule_saturates_like_the_server_rule(rule):
    rng = np.random.default_rng(8)
    server = _start(rule, 4, rng)
    if rule.state_dim(DIM):
        server[0, DIM:] = -1.0  # a foreign checkpoint's negative accumulator counts as 0
    start = server.copy()
    rows = np.arange(4, dtype=np.int64)
    grads = np.full((4, DIM), 3.0e38, np.float32)
    grads[1] = -grads[1]
    grads[2] = 1e-30  # g*g underflows in float32, not in float64
    rule.update(server, rows, grads, DIM)
    device = _device_run(rule, start, [(rows, grads)])
    assert np.isfinite(device).all()
    np.testing.assert_array_equal(device, server)


def test_every_builtin_rule_has_a_device_kernel_and_others_are_refused():
    builtin = (optim.SGD, optim.Adagrad, optim.RowwiseAdagrad, optim.Adam, optim.FTRL,
               optim.SparseAdagrad)  # fmt: skip
    assert set(DEVICE_RULES) == {rule.name for rule in builtin}

    class Custom(optim.SGD):
        name = "custom"

    with pytest.raises(ConfigError, match="table 'emb'.*no device kernel for the rule 'custom'"):
        check_device_rule(Custom(), "emb")
