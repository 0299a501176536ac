"""Sort-based key sets equal numpy's own answers (they replace ``np.unique`` for speed)."""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.core.keysets import has_repeats, unique_keys


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000])
def test_unique_keys_and_repeats_match_numpy(size):
    rng = np.random.default_rng(size)
    for keys in (
        rng.integers(0, 2**64, size, dtype=np.uint64),  # distinct (almost surely)
        rng.integers(0, 5, size).astype(np.uint64),  # many repeats
        np.full(size, 2**64 - 1, np.uint64),
    ):
        np.testing.assert_array_equal(unique_keys(keys), np.unique(keys))
        assert unique_keys(keys).dtype == np.uint64
        assert has_repeats(keys) == (np.unique(keys).size != keys.size)
