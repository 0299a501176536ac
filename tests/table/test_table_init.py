"""Initial values are a pure function of (seed, key): sharding cannot change them."""

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import Initializer, TableConfig
from sparseps.table import SparseTable
from sparseps.table.initializers import initial_values

INITS = [
    Initializer.uniform(-0.5, 0.25),
    Initializer.normal(0.1, 0.02),
    Initializer.constant(0.75),
    Initializer.zeros(),
]


def _keys(n=4000):
    rng = np.random.default_rng(11)
    keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    return np.unique(np.concatenate([keys, np.array([0, 2**64 - 1], np.uint64)]))


@pytest.mark.parametrize("init", INITS, ids=lambda i: i.kind.value)
def test_one_shard_equals_eight_shards(init):
    keys = _keys()
    config = TableConfig(name="t", dim=7, rule=optim.SGD(lr=0.1), initializer=init, seed=1234)
    single = SparseTable(config)
    shards = [SparseTable(config) for _ in range(8)]
    grads = np.zeros((keys.size, 7), np.float32)
    # pull before any row exists (the value a forward pass uses) ...
    expected = single.pull(keys)
    for s, shard in enumerate(shards):
        mine = np.ascontiguousarray(keys[keys % 8 == s])
        np.testing.assert_array_equal(shard.pull(mine), expected[keys % 8 == s])
    # ... equals the row the first push creates, on every shard layout (zero gradient)
    single.push(keys[::-1].copy(), grads)
    np.testing.assert_array_equal(single.pull(keys), expected)
    for s, shard in enumerate(shards):
        mine = np.ascontiguousarray(keys[keys % 8 == s])
        shard.push(mine, grads[: mine.size])
        np.testing.assert_array_equal(shard.pull(mine), expected[keys % 8 == s])


def test_values_follow_the_initializer():
    keys = _keys(20000)
    uniform = initial_values(keys, 16, Initializer.uniform(-0.5, 0.25), seed=0)
    assert uniform.min() >= -0.5 and uniform.max() <= 0.25
    assert abs(uniform.mean() - (-0.125)) < 0.005
    normal = initial_values(keys, 16, Initializer.normal(0.1, 0.02), seed=0)
    assert abs(normal.mean() - 0.1) < 0.001 and abs(normal.std() - 0.02) < 0.001
    np.testing.assert_array_equal(initial_values(keys, 3, Initializer.constant(2.5), 0), 2.5)
    # columns are not copies of each other and seeds give different vectors
    assert abs(np.corrcoef(uniform[:, 0], uniform[:, 1])[0, 1]) < 0.05
    other = initial_values(keys, 16, Initializer.uniform(-0.5, 0.25), seed=1)
    assert (other != uniform).mean() > 0.99
    # a prefix of a wider row is the narrower row (elements are counter-based)
    np.testing.assert_array_equal(initial_values(keys, 4, Initializer.uniform(-1, 1), 5),
                                  initial_values(keys, 9, Initializer.uniform(-1, 1), 5)[:, :4])  # fmt: skip


M64 = 2**64 - 1


def _mix64(x):
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _reference_uniform(key, seed, j, low, high):
    """The documented formula in plain Python integers (sparseps/table/initializers.py)."""
    base = _mix64(key ^ _mix64(seed ^ 0x6A09E667F3BCC908))
    word = _mix64((base + (j + 1) * 0x9E3779B97F4A7C15) & M64)
    return np.float32(low + (high - low) * ((word >> 40) / 2**24))


def test_values_match_the_documented_formula():
    # a change here changes every row's initial value: saved checkpoints would no longer
    # replay, and servers of different versions would disagree
    keys = [0, 1, 2**64 - 1, 987654321]
    got = initial_values(np.array(keys, np.uint64), 3, Initializer.uniform(-0.5, 0.25), seed=77)
    want = [[_reference_uniform(k, 77, j, -0.5, 0.25) for j in range(3)] for k in keys]
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    pinned = initial_values(np.array([0], np.uint64), 2, Initializer.uniform(0, 1), seed=0)
    np.testing.assert_array_equal(
        pinned, np.array([[0.6368125081062317, 0.740985095500946]], np.float32)
    )
