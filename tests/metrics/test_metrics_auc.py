"""AUC against oracles written independently here, on random and adversarial inputs.

The oracle ``pair_auc`` counts every (positive, negative) pair (O(n^2), small n), which
needs no ranks and no sorting, so it shares no code path with the library. Tolerances: exact functions 1e-12 (float rounding only); bucketed AUC (2**20 buckets)
1e-4, the contract, although on these inputs it is far closer.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.errors import ConfigError, InputError
from sparseps.metrics import (
    CTRMetrics,
    auc_from_histograms,
    bucketize,
    exact_auc,
    grouped_auc,
)


def pair_auc(pred, label):
    """Fraction of correctly ordered positive/negative pairs, ties one half; 0.5 if undefined."""
    pred, label = np.asarray(pred, np.float64), np.asarray(label)
    pos, neg = pred[label == 1], pred[label == 0]
    if pos.size == 0 or neg.size == 0:
        return 0.5
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def bucketed_auc(pred, label, num_buckets=2**20):
    m = CTRMetrics(num_buckets=num_buckets)
    m.update(pred, label)
    return m.compute()


RNG = np.random.default_rng(1234)
CASES = {
    "random": (RNG.random(1500), RNG.integers(0, 2, 1500)),
    "informative": (lambda p: (p, (RNG.random(1500) < p).astype(int)))(RNG.random(1500)),
    "all_equal": (np.full(800, 0.37), RNG.integers(0, 2, 800)),
    "exact_0_and_1": (RNG.integers(0, 2, 600).astype(float), RNG.integers(0, 2, 600)),
    "zeros_ones_and_middle": (
        RNG.choice([0.0, 1.0, 0.25, 0.5], 900),
        RNG.integers(0, 2, 900),
    ),
    "heavy_ties": (np.round(RNG.random(2000), 1), RNG.integers(0, 2, 2000)),
    "float32_near_one": (
        (1 - RNG.random(1000) * 0.5).astype(np.float32),
        RNG.integers(0, 2, 1000),
    ),
    "perfect": (np.linspace(0, 1, 500), (np.linspace(0, 1, 500) > 0.5).astype(int)),
    "inverted": (np.linspace(0, 1, 500), (np.linspace(0, 1, 500) < 0.5).astype(int)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_auc_matches_pair_counting(name):
    pred, label = CASES[name]
    assert exact_auc(pred, label) == pytest.approx(pair_auc(pred, label), abs=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bucketed_auc_within_1e4_of_exact(name):
    pred, label = CASES[name]
    result = bucketed_auc(pred, label)
    assert result.auc_defined
    assert abs(result.auc - pair_auc(pred, label)) < 1e-4


def test_known_values():
    assert exact_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75  # 3 of 4 pairs
    assert exact_auc([0.5, 0.5, 0.5], [1, 0, 0]) == 0.5  # every pair tied
    assert exact_auc([0.2, 0.9], [0, 1]) == 1.0
    assert exact_auc([0.2, 0.9], [1, 0]) == 0.0
    # ties across classes: pairs (0.3+ vs 0.3-) = 1/2, (0.3+ vs 0.1-) = 1 -> 1.5 / 2
    assert exact_auc([0.3, 0.3, 0.1], [1, 0, 0]) == 0.75


@pytest.mark.parametrize(
    "pred,label",
    [([], []), ([0.2, 0.7, 0.7], [1, 1, 1]), ([0.2, 0.7, 0.7], [0, 0, 0]), ([1.0], [0])],
    ids=["empty", "only_positives", "only_negatives", "single"],
)
def test_undefined_auc_is_half_and_flagged_never_nan(pred, label):
    assert exact_auc(pred, label) == 0.5
    result = bucketed_auc(pred, label)
    assert result.auc == 0.5 and result.auc_defined is False
    assert all(np.isfinite(v) for v in result.to_dict().values() if isinstance(v, float))


def test_all_equal_predictions_are_defined_and_half():
    result = bucketed_auc(np.full(10, 0.8), [0, 1] * 5)
    assert result.auc == 0.5 and result.auc_defined is True


def test_coarse_buckets_count_same_bucket_pairs_as_ties():
    # 4 buckets: 0.1 and 0.2 share bucket 0, so that pair counts one half
    pred, label = [0.1, 0.2, 0.6, 0.9], [1, 0, 0, 1]
    assert bucketed_auc(pred, label, num_buckets=4).auc == pytest.approx((0.5 + 0 + 1 + 1) / 4)
    assert exact_auc(pred, label) == pytest.approx(2 / 4)


def test_auc_from_histograms_by_hand():
    # bucket:        0  1  2
    pos = np.array([0, 1, 2])
    neg = np.array([2, 1, 0])
    # negatives in bucket 0 lose to all 3 positives: 2*3 = 6 correct pairs;
    # the negative in bucket 1 loses to 2 positives and ties 1: 2 + 0.5 -> 8.5 of 9 pairs
    assert auc_from_histograms(pos, neg) == pytest.approx(8.5 / 9)
    assert auc_from_histograms(np.zeros(3), np.ones(3)) == 0.5
    with pytest.raises(InputError):
        auc_from_histograms(np.ones(3), np.ones(2))


def test_bucketize_edges():
    b = bucketize(np.array([0.0, 0.2499, 0.25, 0.999, 1.0]), 4)
    assert b.tolist() == [0, 0, 1, 3, 3]
    assert b.dtype == np.int64
    with pytest.raises(InputError):
        bucketize([1.5], 4)
    with pytest.raises(ConfigError):
        bucketize([0.5], 0)


def _oracle_grouped(pred, label, group):
    aucs, sizes = [], []
    for g in np.unique(group):
        sel = group == g
        if 0 < label[sel].sum() < sel.sum():
            aucs.append(pair_auc(pred[sel], label[sel]))
            sizes.append(sel.sum())
    if not aucs:
        return 0.5, 0.5, 0
    return float(np.mean(aucs)), float(np.average(aucs, weights=sizes)), len(aucs)


def test_grouped_auc_matches_per_group_oracle():
    rng = np.random.default_rng(5)
    n = 3000
    pred = np.round(rng.random(n), 2)  # ties inside groups
    label = (rng.random(n) < pred).astype(int)
    group = rng.integers(0, 120, n).astype(np.uint64) * np.uint64(2**40)  # big uint64 ids
    uauc, gauc, groups = grouped_auc(pred, label, group)
    o_uauc, o_gauc, o_groups = _oracle_grouped(pred, label, group)
    assert groups == o_groups
    assert uauc == pytest.approx(o_uauc, abs=1e-12)
    assert gauc == pytest.approx(o_gauc, abs=1e-12)
    # order of the samples does not matter, bit for bit
    perm = rng.permutation(n)
    assert grouped_auc(pred[perm], label[perm], group[perm]) == (uauc, gauc, groups)


def test_grouped_auc_by_hand_and_degenerate_groups():
    # group 7: pred [0.2, 0.6] label [0, 1] -> AUC 1 (size 2)
    # group 8: pred [0.9, 0.1, 0.5] label [0, 1, 0] -> 0 of 2 pairs -> AUC 0 (size 3)
    # group 9: only positives -> left out
    pred = [0.2, 0.6, 0.9, 0.1, 0.5, 0.3]
    label = [0, 1, 0, 1, 0, 1]
    group = [7, 7, 8, 8, 8, 9]
    uauc, gauc, groups = grouped_auc(pred, label, group)
    assert groups == 2
    assert uauc == pytest.approx((1 + 0) / 2)
    assert gauc == pytest.approx((1 * 2 + 0 * 3) / 5)
    assert grouped_auc([0.5, 0.6], [1, 1], [1, 2]) == (0.5, 0.5, 0)
    assert grouped_auc([], [], np.zeros(0, np.int64)) == (0.5, 0.5, 0)
