"""The CTR bundle: every metric against hand arithmetic, degenerate cases, exactness, speed."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from sparseps.errors import ConfigError, InputError
from sparseps.metrics import CTRMetrics, MetricResult, bucket_error_from_histograms

# Fixed-point sums round each per-sample term to 2**-32: hand values agree to ~1e-10.
TOL = 1e-9


def test_every_metric_on_a_tiny_example_by_hand():
    m = CTRMetrics()
    m.update(np.array([0.1, 0.4], np.float32), np.array([0, 0]))
    m.update(np.array([0.35, 0.8]), np.array([1.0, 1.0]))
    r = m.compute()
    assert r.count == 4 and r.clicks == 2
    # pairs (pos, neg): (0.35,0.1) ok, (0.35,0.4) wrong, (0.8,0.1) ok, (0.8,0.4) ok -> 3/4
    assert r.auc == pytest.approx(0.75, abs=1e-12) and r.auc_defined
    assert r.actual_ctr == 2 / 4
    # float32 0.1 and 0.4 are not exactly 0.1 and 0.4: use the float32 values in sums
    p = [float(np.float32(0.1)), float(np.float32(0.4)), 0.35, 0.8]
    assert r.predicted_ctr == pytest.approx(sum(p) / 4, abs=TOL)  # 1.65 / 4 = 0.4125
    assert r.copc == pytest.approx(2 / sum(p), abs=TOL)  # 2 / 1.65 = 1.2121...
    # |err| = 0.1, 0.4, 0.65, 0.2 -> 1.35 / 4
    assert r.mae == pytest.approx((p[0] + p[1] + (1 - p[2]) + (1 - p[3])) / 4, abs=TOL)
    assert r.mae == pytest.approx(0.3375, abs=1e-7)
    # err^2 = 0.01, 0.16, 0.4225, 0.04 -> sqrt(0.6325 / 4)
    assert r.rmse == pytest.approx(math.sqrt(0.6325 / 4), abs=1e-7)
    # -ln(0.9) - ln(0.6) - ln(0.35) - ln(0.8) = 0.10536 + 0.51083 + 1.04982 + 0.22314
    expected_ll = -(math.log(1 - p[0]) + math.log(1 - p[1]) + math.log(p[2]) + math.log(p[3])) / 4
    assert r.logloss == pytest.approx(expected_ll, abs=TOL)
    assert r.logloss == pytest.approx(1.8891518 / 4, abs=1e-6)
    # 4 samples never make a pool trustworthy: no bucket closes -> 0.0
    assert r.bucket_error == 0.0
    assert r.uauc is None and r.gauc is None and r.groups == 0


def test_logloss_clips_predictions_0_and_1():
    m = CTRMetrics()
    m.update([1.0, 0.0, 1.0, 0.0], [0, 1, 1, 0])
    r = m.compute()
    # wrong & certain: -ln(1e-7) each; right & certain: -ln(1 - 1e-7) each
    expected = (2 * -math.log(1e-7) + 2 * -math.log(1 - 1e-7)) / 4
    assert r.logloss == pytest.approx(expected, abs=TOL)
    assert r.mae == 0.5 and r.rmse == pytest.approx(math.sqrt(0.5))
    assert r.copc == pytest.approx(1.0)  # 2 clicks, 2.0 predicted


def test_bucket_error_by_hand_one_bucket_per_pool():
    # 10 buckets are 0.1 apart (> max_span 0.01): every bucket is its own pool.
    # bucket 5 (c=0.5): 500 shows, 300 clicks; stderr sqrt(0.5/(0.5*500)) = 0.045 < 0.05
    #   -> closes with |0.6/0.5 - 1| = 0.2, weight 500
    # bucket 2 (c=0.2): 2000 shows, 360 clicks; stderr sqrt(0.8/(0.2*2000)) = 0.045
    #   -> closes with |0.18/0.2 - 1| = 0.1, weight 2000
    # bucket 8 (c=0.8): 50 shows; stderr sqrt(0.2/(0.8*50)) = 0.071 -> never closes
    # bucket error = (0.2*500 + 0.1*2000) / 2500 = 0.12
    m = CTRMetrics(num_buckets=10)
    for pred, shows, clicks in [(0.55, 500, 300), (0.25, 2000, 360), (0.85, 50, 10)]:
        m.update(np.full(shows, pred), np.arange(shows) < clicks)
    assert m.compute().bucket_error == pytest.approx(0.12, abs=1e-12)


def test_bucket_error_by_hand_pooled_buckets():
    # 1024 buckets: c_i = i/1024 exactly; pools restart when c moves > 0.01 = 10.24
    # buckets, i.e. at buckets 0, 11, 22, ..., 297, 308 -> buckets 300 and 305 share a pool.
    # After bucket 300 alone (500 shows): sqrt((1-0.293)/(0.293*500)) = 0.0695, stays open.
    # With 305 (1000 shows): q = (300 + 305) / 2 / 1024 = 0.29541015625,
    #   stderr sqrt((1-q)/(q*1000)) = 0.0488 < 0.05 -> closes; clicks 150 + 200 = 350.
    pos, neg = np.zeros(1024, np.int64), np.zeros(1024, np.int64)
    pos[300], neg[300], pos[305], neg[305] = 150, 350, 200, 300
    q = 0.29541015625
    assert bucket_error_from_histograms(pos, neg) == pytest.approx(abs(0.35 / q - 1), abs=1e-12)
    # same through the accumulator (predictions at bucket centres)
    m = CTRMetrics(num_buckets=1024)
    m.update(np.full(500, 300.5 / 1024), np.arange(500) < 150)
    m.update(np.full(500, 305.5 / 1024), np.arange(500) < 200)
    assert m.compute().bucket_error == pytest.approx(abs(0.35 / q - 1), abs=1e-12)
    with pytest.raises(ConfigError):
        bucket_error_from_histograms(pos, neg, max_span=0)


def _reference_bucket_error(pos, neg, max_span=0.01, bound=0.05):
    """Plain-Python statement of the documented definition (docs/metrics.md)."""
    size, start, error_sum, weight = len(pos), None, 0.0, 0.0
    n = k = csum = 0.0
    for i in range(size):
        c = i / size
        if start is None or abs(c - start) > max_span:
            start, n, k, csum = c, 0.0, 0.0, 0.0
        n, k, csum = n + pos[i] + neg[i], k + pos[i], csum + c * (pos[i] + neg[i])
        if n > 0 and csum > 0:
            q = csum / n
            if math.sqrt((1 - q) / (q * n)) < bound:
                error_sum, weight, start = error_sum + abs(k / n / q - 1) * n, weight + n, None
    return error_sum / weight if weight else 0.0


def test_bucket_error_matches_reference_on_random_histograms():
    rng = np.random.default_rng(3)
    for size in (64, 1000, 4096):
        pos = rng.poisson(rng.random(size) * 40)
        neg = rng.poisson(rng.random(size) * 200)
        got = bucket_error_from_histograms(pos, neg)
        assert got == pytest.approx(_reference_bucket_error(pos, neg), rel=1e-12, abs=1e-15)
        assert got > 0


def test_no_samples_gives_documented_zeros_not_nan():
    m = CTRMetrics()
    m.update(np.zeros(0, np.float32), np.zeros(0, np.float32))  # empty batch is a no-op
    r = m.compute()
    assert r == MetricResult(0.5, False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    assert m.compute(global_=True) == r  # no process group: global is local


def test_one_class_only_is_flagged_and_finite():
    m = CTRMetrics()
    m.update([0.2, 0.4], [1, 1], group=[5, 6])
    r = m.compute()
    assert (r.auc, r.auc_defined, r.actual_ctr, r.count) == (0.5, False, 1.0, 2)
    assert r.copc == pytest.approx(2 / 0.6)
    assert (r.uauc, r.gauc, r.groups) == (0.5, 0.5, 0)


def test_grouped_metrics_by_hand():
    m = CTRMetrics()
    # user 7: AUC 1 (2 samples); user 8: AUC 0 (3 samples); user 9: positives only
    m.update([0.2, 0.6, 0.9], [0, 1, 0], group=np.array([7, 7, 8], np.int64))
    m.update([0.1, 0.5, 0.3], [1, 0, 1], group=np.array([8, 8, 9], np.int64))
    r = m.compute()
    assert r.groups == 2 and r.uauc == pytest.approx(0.5) and r.gauc == pytest.approx(2 / 5)


def test_batches_merge_and_state_are_order_independent_bit_for_bit():
    rng = np.random.default_rng(11)
    n = 20_000
    pred = rng.random(n).astype(np.float32)
    label = (rng.random(n) < pred).astype(np.float32)
    users = rng.integers(0, 300, n)
    whole = CTRMetrics()
    whole.update(pred, label, users)
    cuts = np.sort(rng.choice(np.arange(1, n), 40, replace=False))
    parts = list(
        zip(np.split(pred, cuts), np.split(label, cuts), np.split(users, cuts), strict=True)
    )
    order = rng.permutation(len(parts))
    shuffled, a, b = CTRMetrics(), CTRMetrics(), CTRMetrics()
    for i in order:
        shuffled.update(*parts[i])
        (a if i % 2 else b).update(*parts[i])
    merged = CTRMetrics().merge(b).merge(a)
    expected = whole.compute()
    assert shuffled.compute() == expected
    assert merged.compute() == expected
    restored = CTRMetrics.from_state(shuffled.state())
    assert restored.compute() == expected
    for key, value in whole.state().items():
        if key in ("pos", "neg", "sums"):
            assert np.array_equal(value, merged.state()[key]), key
    whole.reset()
    assert whole.compute().count == 0 and whole.count == 0


def test_validation_errors_name_the_problem():
    m = CTRMetrics(num_buckets=16)
    with pytest.raises(InputError, match="outside"):
        m.update([0.5, float("nan")], [0, 1])
    with pytest.raises(InputError, match="outside"):
        m.update([1.5], [1])
    with pytest.raises(InputError, match="not 0 or 1"):
        m.update([0.5], [2])
    with pytest.raises(InputError, match="label has"):
        m.update([0.5, 0.5], [1])
    with pytest.raises(InputError, match="integers"):
        m.update([0.5], [1], group=[0.5])
    m.update([0.5], [1])
    with pytest.raises(InputError, match="grouping ids"):
        m.update([0.5], [1], group=[3])
    with pytest.raises(InputError, match="num_buckets differ"):
        m.merge(CTRMetrics(num_buckets=8))
    for bad in (0, 2.5, True, 2**40):
        with pytest.raises(ConfigError):
            CTRMetrics(num_buckets=bad)
    assert m.count == 1  # failed updates added nothing


def test_update_of_one_million_predictions_is_fast():
    rng = np.random.default_rng(0)
    pred = rng.random(1_000_000).astype(np.float32)
    label = (rng.random(1_000_000) < pred).astype(np.float32)
    m = CTRMetrics()
    m.update(pred[:10], label[:10])  # compile / load the cached kernel outside the timing
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        m.update(pred, label)
        best = min(best, time.perf_counter() - start)
    assert best < 1.0, f"update of 1M predictions took {best:.3f} s"
    assert m.count == 3_000_010
