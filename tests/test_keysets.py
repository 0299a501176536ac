"""Key sets equal numpy's own answers (they replace ``np.unique`` for speed)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.core.keysets import has_repeats, unique_inverse, unique_keys


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000])
def test_unique_keys_and_repeats_match_numpy(size):
    for keys in _key_sets(size):
        np.testing.assert_array_equal(unique_keys(keys), np.unique(keys))
        assert unique_keys(keys).dtype == np.uint64
        assert has_repeats(keys) == (np.unique(keys).size != keys.size)


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000, 20_000])
def test_unique_inverse_matches_numpy(size):
    for keys in _key_sets(size):
        distinct, inverse = unique_inverse(keys)
        expected, expected_inverse = np.unique(keys, return_inverse=True)
        np.testing.assert_array_equal(distinct, expected)
        np.testing.assert_array_equal(inverse, expected_inverse)
        assert distinct.dtype == np.uint64 and inverse.dtype == np.int64


def _key_sets(size):
    rng = np.random.default_rng(size)
    return (
        rng.integers(0, 2**64, size, dtype=np.uint64),  # distinct (almost surely)
        rng.integers(0, 5, size).astype(np.uint64),  # many repeats
        np.full(size, 2**64 - 1, np.uint64),
        # keys that share their low bits, as in a table slot's probe sequence
        (rng.integers(0, 50, size).astype(np.uint64) << np.uint64(40)),
    )
