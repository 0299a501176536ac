"""TaggedIndex (a split table's key index) against a dict, and float16 storage against numpy."""

from __future__ import annotations

import numpy as np

from sparseps.optim.half import floats_to_halves, halves_to_floats
from sparseps.table.tagged_index import TaggedIndex


def test_tagged_index_matches_a_dict_through_inserts_erases_and_growth():
    rng = np.random.default_rng(0)
    index, oracle = TaggedIndex(), {}
    for step in range(30):
        keys = rng.integers(0, 5000, 400).astype(np.uint64)
        keys[:3] = [0, 2**64 - 1, 2**63]  # every uint64 is a key
        ids, new = index.find_or_insert(keys)
        for key, i, fresh in zip(keys.tolist(), ids.tolist(), new.tolist(), strict=True):
            assert (key not in oracle) == fresh, step
            assert oracle.setdefault(key, i) == i
        gone = rng.integers(0, 5000, 300).astype(np.uint64)
        freed = index.erase(np.unique(gone))
        for key, i in zip(np.unique(gone).tolist(), freed.tolist(), strict=True):
            assert oracle.pop(key, -1) == i
        probe = rng.integers(0, 6000, 1000).astype(np.uint64)
        assert index.find(probe).tolist() == [oracle.get(k, -1) for k in probe.tolist()]
        assert len(index) == len(oracle)
    keys, ids = index.items()
    assert dict(zip(keys.tolist(), ids.tolist(), strict=True)) == oracle
    assert max(oracle.values()) < index.high_water <= len(oracle) + index.free_ids
    # ids stay dense: erased ids are handed out again first
    before = index.high_water
    index.find_or_insert(np.arange(10**6, 10**6 + index.free_ids, dtype=np.uint64))
    assert index.high_water == before


def test_tagged_index_is_smaller_than_the_key_index():
    from sparseps.table import KeyIndex

    keys = np.random.default_rng(1).integers(0, 2**63, 200_000).astype(np.uint64)
    tagged, plain = TaggedIndex(), KeyIndex()
    tagged.find_or_insert(keys)
    plain.find_or_insert(keys)
    assert tagged.nbytes < 0.8 * plain.nbytes


def test_half_conversions_equal_numpy():
    rng = np.random.default_rng(2)
    x = np.concatenate([
        rng.normal(0, 1, 20000), rng.normal(0, 1e-5, 20000), rng.uniform(-7e4, 7e4, 20000),
        [0.0, -0.0, 65504.0, 65519.99, 65520.0, 2.0**-25, 3 * 2.0**-25, 2.0**-24, 6.1e-5],
    ]).astype(np.float32)[None]  # fmt: skip
    halves = np.empty(x.shape, np.uint16)
    floats_to_halves(x, halves)
    want = np.clip(x.astype(np.float64), -65504, 65504).astype(np.float16)
    np.testing.assert_array_equal(halves, want.view(np.uint16))
    back = np.empty(x.shape, np.float64)
    halves_to_floats(halves, back)
    np.testing.assert_array_equal(back, want.astype(np.float64))
