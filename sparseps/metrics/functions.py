"""Pure metric functions: arrays in, numbers out, no state and no communication.

Conventions shared by every function here (and by :class:`~sparseps.metrics.CTRMetrics`):

- ``pred`` is a 1-D array of probabilities in ``[0, 1]`` (a ``[n, 1]`` column is accepted),
  ``label`` a same-length array of 0/1 values, ``group`` a same-length integer array of
  grouping ids (user ids, query ids...).
- AUC is the probability that a random positive is ranked above a random negative, ties
  counting one half. When one class is missing (or there are no samples) AUC is *not
  defined*; the functions then return **0.5** (never NaN) and callers that need to tell
  the difference check that both classes are present (``MetricResult.auc_defined``).

Worked example: ``pred = [0.1, 0.4, 0.35, 0.8]``, ``label = [0, 0, 1, 1]`` has 2 x 2
positive/negative pairs, of which 3 are ordered correctly (0.35 > 0.1, 0.8 > 0.1,
0.8 > 0.4) -> ``exact_auc = 3 / 4 = 0.75``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import ConfigError, InputError
from . import _kernels

__all__ = [
    "GroupedAUC",
    "accuracy",
    "auc_from_histograms",
    "bucket_error_from_histograms",
    "bucketize",
    "check_inputs",
    "check_threshold",
    "count_correct",
    "exact_auc",
    "grouped_auc",
    "mae",
    "mse",
    "rmse",
]

MAX_BUCKETS = 1 << 28  # 2 x 2 GiB of int64 histograms: far beyond any useful resolution


class GroupedAUC(NamedTuple):
    """User-grouped AUC: ``uauc`` (plain mean of per-group AUCs), ``gauc`` (weighted by
    group size), ``groups`` (how many groups had both classes and entered the means)."""

    uauc: float
    gauc: float
    groups: int


def check_num_buckets(num_buckets: object) -> int:
    """Validate a histogram size (an int in ``1 .. 2**28``); raises ConfigError."""
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int | np.integer):
        raise ConfigError(f"num_buckets must be an int, got {num_buckets!r}")
    if not 1 <= int(num_buckets) <= MAX_BUCKETS:
        raise ConfigError(f"num_buckets must be in 1..{MAX_BUCKETS}, got {num_buckets}")
    return int(num_buckets)


def _column(values: object, name: str, where: str, *, allow_bool: bool = False) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise InputError(f"{where}: {name} must be 1-D (or [n, 1]), got shape {array.shape}")
    if array.dtype.kind not in ("fiub" if allow_bool else "fiu"):
        raise InputError(f"{where}: {name} must be a real numeric array, got dtype {array.dtype}")
    return array


def check_inputs(
    pred: object, label: object, group: object = None, *, where: str = "metrics"
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate and convert one batch; returns ``(pred float64, label uint8, group uint64)``.

    Raises:
        InputError: wrong shape or dtype, lengths that differ, a prediction outside
            ``[0, 1]`` or NaN, a label other than 0/1. The message says where and how many.
    """
    p = _column(pred, "pred", where).astype(np.float64, copy=False)
    y = _column(label, "label", where, allow_bool=True)
    if y.shape != p.shape:
        raise InputError(f"{where}: pred has {p.size} values but label has {y.size}")
    bad = ~((p >= 0.0) & (p <= 1.0))  # also catches NaN
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{where}: {int(bad.sum())} predictions are outside [0, 1] or NaN (first at index "
            f"{first}: {p[first]!r}); pass probabilities (sigmoid of the logits)"
        )
    bad = (y != 0) & (y != 1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{where}: {int(bad.sum())} labels are not 0 or 1 (first at index {first}: "
            f"{y[first]!r}); binarize labels before computing CTR metrics"
        )
    y = y.astype(np.uint8)
    if group is None:
        return p, y, None
    g = _column(group, "group", where)
    if g.dtype.kind not in "iu":
        raise InputError(f"{where}: group ids must be integers, got dtype {g.dtype}")
    if g.shape != p.shape:
        raise InputError(f"{where}: pred has {p.size} values but group has {g.size}")
    # int64 ids are reinterpreted, not converted: equal ids stay equal, distinct stay distinct
    g = g.view(np.uint64) if g.dtype.itemsize == 8 else g.astype(np.uint64)
    return p, y, g


def bucketize(pred: object, num_buckets: int) -> np.ndarray:
    """Histogram bucket of each prediction: ``min(floor(p * num_buckets), num_buckets - 1)``.

    Bucket ``i`` holds predictions in ``[i / B, (i + 1) / B)``; ``p == 1`` goes to the last
    bucket. Returns int64 ``[n]``. Raises InputError for predictions outside ``[0, 1]``.
    """
    num_buckets = check_num_buckets(num_buckets)
    p = _column(pred, "pred", "bucketize").astype(np.float64, copy=False)
    if not ((p >= 0.0) & (p <= 1.0)).all():
        raise InputError("bucketize: predictions must be in [0, 1] and not NaN")
    return np.minimum((p * num_buckets).astype(np.int64), num_buckets - 1)


def _histograms(pos: object, neg: object, where: str) -> tuple[np.ndarray, np.ndarray]:
    pos, neg = np.asarray(pos), np.asarray(neg)
    if pos.ndim != 1 or pos.shape != neg.shape or pos.size == 0:
        raise InputError(
            f"{where}: pos and neg must be non-empty 1-D arrays of equal length, got "
            f"shapes {pos.shape} and {neg.shape}"
        )
    if (pos < 0).any() or (neg < 0).any():
        raise InputError(f"{where}: histogram counts must be >= 0")
    return pos, neg


def auc_from_histograms(pos: object, neg: object) -> float:
    """AUC from per-bucket counts of positives and negatives (bucket 0 = lowest scores).

    A positive in a higher bucket than a negative is a correct pair; a pair in the same
    bucket counts one half (the trapezoid rule of the ROC curve). With one class missing
    the result is 0.5 (undefined; see the module docstring).

    Args:
        pos, neg: 1-D arrays of equal length, counts (int64 or float64) per bucket.

    Returns:
        float in [0, 1].
    """
    pos, neg = _histograms(pos, neg, "auc_from_histograms")
    total_pos, total_neg = float(pos.sum()), float(neg.sum())
    if total_pos == 0 or total_neg == 0:
        return 0.5
    # the positives above a bucket are exact integers; the products go to float64 (they
    # can exceed int64)
    dtype = np.int64 if pos.dtype.kind in "iub" and neg.dtype.kind in "iub" else np.float64
    area = _kernels.auc_area(np.ascontiguousarray(pos, dtype), np.ascontiguousarray(neg, dtype))
    return float(area) / (total_pos * total_neg)


def _tie_ranks(run_starts: np.ndarray, n: int) -> np.ndarray:
    """1-based ranks of sorted values, ties averaged; ``run_starts`` = first index of each run."""
    run_ends = np.append(run_starts[1:], n)
    run_of = np.repeat(np.arange(run_starts.size), run_ends - run_starts)
    return ((run_starts + run_ends + 1) / 2.0)[run_of]  # mean of ranks start+1 .. end


def exact_auc(pred: object, label: object) -> float:
    """Exact AUC by the rank-sum (Mann-Whitney) formula, ties given average ranks.

    ``AUC = (R_pos - P (P + 1) / 2) / (P N)`` where ``R_pos`` is the sum of the positives'
    ranks. O(n log n), vectorized. The one exact AUC of sparseps: the synthetic data's
    Bayes AUC, the online stream's and the tests all call this one.

    Args:
        pred: ``[n]`` probabilities in ``[0, 1]`` (only their order counts).
        label: ``[n]`` 0/1 labels.

    Returns:
        the AUC; **0.5** when one class is missing or there are no samples (AUC is not
        defined there; see the module docstring: never NaN, like the bucketed AUC).

    Raises:
        InputError: the shapes differ, a prediction is outside ``[0, 1]`` or a label is
            not 0/1 (:func:`check_inputs`).
    """
    p, y, _ = check_inputs(pred, label, where="exact_auc")
    n = p.size
    positives = int(y.sum())
    negatives = n - positives
    if positives == 0 or negatives == 0:
        return 0.5
    order = np.argsort(p, kind="stable")
    sorted_p = p[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_p[1:] != sorted_p[:-1])))
    ranks = _tie_ranks(starts, n)
    # ranks are half-integers: their float64 sum is exact (below 2**52)
    rank_sum = float(ranks[y[order] == 1].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def grouped_auc(pred: object, label: object, group: object) -> GroupedAUC:
    """Per-group exact AUC, averaged: UAUC (plain mean) and GAUC (weighted by group size).

    Only groups holding both a positive and a negative enter the means; with no such
    group both are 0.5 and ``groups`` is 0. Sorting is by (group, prediction), so the
    result does not depend on the order of the samples. O(n log n), vectorized.

    Returns:
        ``GroupedAUC(uauc, gauc, groups)``.
    """
    p, y, g = check_inputs(pred, label, group, where="grouped_auc")
    n = p.size
    if n == 0:
        return GroupedAUC(0.5, 0.5, 0)
    if g is None:
        raise InputError("grouped_auc: group ids are required (one per prediction), got None")
    order = np.lexsort((p, g))
    g, p, y = g[order], p[order], y[order]
    new_group = np.concatenate(([True], g[1:] != g[:-1]))
    group_starts = np.flatnonzero(new_group)
    group_of = np.cumsum(new_group) - 1
    new_run = new_group.copy()
    new_run[1:] |= p[1:] != p[:-1]
    # global tie-averaged rank minus the group's offset = rank within the group
    ranks = _tie_ranks(np.flatnonzero(new_run), n) - group_starts[group_of]
    num_groups = group_starts.size
    sizes = np.bincount(group_of, minlength=num_groups)
    positives = np.bincount(group_of, weights=y, minlength=num_groups)
    rank_sums = np.bincount(group_of, weights=ranks * y, minlength=num_groups)
    negatives = sizes - positives
    valid = (positives > 0) & (negatives > 0)
    if not valid.any():
        return GroupedAUC(0.5, 0.5, 0)
    pv, nv = positives[valid], negatives[valid]
    aucs = (rank_sums[valid] - pv * (pv + 1) / 2.0) / (pv * nv)
    weights = sizes[valid].astype(np.float64)
    return GroupedAUC(
        float(aucs.mean()), float(np.dot(aucs, weights) / weights.sum()), int(valid.sum())
    )


def bucket_error_from_histograms(
    pos: object, neg: object, *, max_span: float = 0.01, relative_error_bound: float = 0.05
) -> float:
    """Calibration error in adaptive prediction buckets (PaddlePaddle's definition).

    Walk the histogram from low to high predictions, bucket ``i`` standing for the
    predicted CTR ``c_i = i / B``. Samples are pooled into an adaptive bucket until its
    estimate is statistically trustworthy:

    - a pool restarts (counts zeroed) whenever the current ``c_i`` is more than
      ``max_span`` away from the ``c`` at which the pool started;
    - after adding bucket ``i`` the pool has ``n`` impressions, ``k`` clicks and mean
      predicted CTR ``q = sum(c_j * n_j) / n``; its relative standard error is
      ``sqrt((1 - q) / (q n))``; once it is below ``relative_error_bound`` the pool is
      closed, contributing ``|k / n / q - 1|`` with weight ``n``.

    The result is the ``n``-weighted mean of those relative CTR errors over closed pools
    (0.0 if no pool closed, e.g. too few samples). Pools whose ``q`` is 0 never close.

    Args:
        pos, neg: per-bucket counts as for :func:`auc_from_histograms`.
        max_span: widest prediction range one pool may cover.
        relative_error_bound: standard error below which a pool's CTR is trusted.
    """
    pos, neg = _histograms(pos, neg, "bucket_error_from_histograms")
    if not (0 < max_span <= 1 and relative_error_bound > 0):
        raise ConfigError(
            f"bucket_error_from_histograms: need 0 < max_span <= 1 and "
            f"relative_error_bound > 0, got {max_span} and {relative_error_bound}"
        )
    return float(
        _kernels.bucket_error(
            np.ascontiguousarray(pos, np.int64),
            np.ascontiguousarray(neg, np.int64),
            float(max_span),
            float(relative_error_bound),
        )
    )


def check_threshold(threshold: object) -> float:
    """Validate a classification threshold (a finite number in ``[0, 1]``); raises ConfigError."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.floating):
        raise ConfigError(f"threshold must be a number in [0, 1], got {threshold!r}")
    if not 0.0 <= float(threshold) <= 1.0:
        raise ConfigError(f"threshold must be in [0, 1], got {threshold}")
    return float(threshold)


def count_correct(pred: np.ndarray, label: np.ndarray, threshold: float) -> int:
    """Samples with ``(pred >= threshold) == label`` (arrays already checked)."""
    return int(np.count_nonzero((pred >= threshold) == (label == 1)))


def accuracy(pred: object, label: object, threshold: float = 0.5) -> float:
    """Share of samples classified correctly: ``pred >= threshold`` is a positive.

    0.0 when there are no samples. E.g. ``accuracy([0.2, 0.7, 0.5], [0, 0, 1]) == 2 / 3``.
    """
    p, y, _ = check_inputs(pred, label, where="accuracy")
    return count_correct(p, y, check_threshold(threshold)) / p.size if p.size else 0.0


def _errors(pred: object, label: object, where: str) -> np.ndarray:
    """``pred - label`` in float64; any real labels (regression), not only 0/1."""
    p = _column(pred, "pred", where).astype(np.float64, copy=False)
    y = _column(label, "label", where, allow_bool=True).astype(np.float64, copy=False)
    if y.shape != p.shape:
        raise InputError(f"{where}: pred has {p.size} values but label has {y.size}")
    if not (np.isfinite(p).all() and np.isfinite(y).all()):
        raise InputError(f"{where}: predictions and labels must be finite")
    return p - y


def mse(pred: object, label: object) -> float:
    """Mean squared error ``mean((pred - label) ** 2)``; 0.0 without samples."""
    err = _errors(pred, label, "mse")
    return float(np.mean(err * err)) if err.size else 0.0


def rmse(pred: object, label: object) -> float:
    """``sqrt(mse(pred, label))``."""
    return float(np.sqrt(mse(pred, label)))


def mae(pred: object, label: object) -> float:
    """Mean absolute error ``mean(|pred - label|)``; 0.0 without samples."""
    err = _errors(pred, label, "mae")
    return float(np.mean(np.abs(err))) if err.size else 0.0
