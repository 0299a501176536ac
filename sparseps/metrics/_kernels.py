"""Compiled loops of the metrics package (numba, ``nogil``, cached).

The kernels assume validated input (the public functions check dtypes, shapes and
ranges first): predictions are float64 in ``[0, 1]``, labels uint8 in ``{0, 1}``.

Exact sums. The accumulator's float sums (predictions, absolute and squared errors,
logloss) must give bit-identical totals whatever the order in which samples, batches or
workers are added. Float addition is not associative, so each per-sample term is rounded
once to a fixed-point integer (units of ``2**-FIXED_BITS``) and the integers are summed.
One int64 is not wide enough (a logloss term is up to ~16.1, i.e. ~2**36 units), so every
sum is kept as two int64 *limbs* ``value = hi * 2**LIMB_BITS + lo`` with ``0 <= lo <
2**LIMB_BITS`` after :func:`normalize_limbs`. Integer addition is associative, hence the
totals are order-independent; the rounding costs at most ``2**-33`` (~1.2e-10) per sample.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.jit import njit

FIXED_BITS = 32  # fixed-point resolution of a per-sample term: 2**-32 ~ 2.3e-10
LIMB_BITS = 24  # low limb width; hi limb counts units of 2**(LIMB_BITS - FIXED_BITS)
LIMB_MASK = (1 << LIMB_BITS) - 1
LOGLOSS_EPS = 1e-7  # predictions are clipped to [eps, 1 - eps] before the log

# rows of the [NUM_SUMS, 2] limb array
SUM_PRED, SUM_ABSERR, SUM_SQRERR, SUM_LOGLOSS = 0, 1, 2, 3
NUM_SUMS = 4


@njit(nogil=True, cache=True)
def _add_fixed(limbs, row, value):
    # floor(x + 0.5): round half up, identical on every worker (no banker's rounding subtleties)
    units = np.int64(math.floor(value * 4294967296.0 + 0.5))  # 2**FIXED_BITS
    limbs[row, 0] += units >> 24  # LIMB_BITS
    limbs[row, 1] += units & 16777215  # LIMB_MASK


@njit(nogil=True, cache=True)
def accumulate(pred, label, num_buckets, pos_hist, neg_hist, limbs):
    """Add a batch to the histograms and the fixed-point sums (in place).

    Args:
        pred: float64 [n] in [0, 1].
        label: uint8 [n] in {0, 1}.
        num_buckets: histogram size B; sample goes to ``min(floor(p * B), B - 1)``.
        pos_hist, neg_hist: int64 [B] counts of positive / negative samples per bucket.
        limbs: int64 [NUM_SUMS, 2] fixed-point sums (not normalized on return).
    """
    lo_clip = LOGLOSS_EPS
    hi_clip = 1.0 - LOGLOSS_EPS
    for i in range(pred.size):
        p = pred[i]
        bucket = np.int64(p * num_buckets)
        if bucket >= num_buckets:
            bucket = num_buckets - 1
        clipped = min(max(p, lo_clip), hi_clip)
        if label[i]:
            pos_hist[bucket] += 1
            err = 1.0 - p
            loss = -math.log(clipped)
        else:
            neg_hist[bucket] += 1
            err = p
            loss = -math.log(1.0 - clipped)
        _add_fixed(limbs, SUM_PRED, p)
        _add_fixed(limbs, SUM_ABSERR, err)
        _add_fixed(limbs, SUM_SQRERR, err * err)
        _add_fixed(limbs, SUM_LOGLOSS, loss)


def normalize_limbs(limbs: np.ndarray) -> np.ndarray:
    """Carry the low limbs into the high ones so that ``0 <= lo < 2**LIMB_BITS`` (in place)."""
    carry = limbs[:, 1] >> LIMB_BITS
    limbs[:, 0] += carry
    limbs[:, 1] &= LIMB_MASK
    return limbs


def limbs_to_float(limbs: np.ndarray, row: int) -> float:
    """The exact integer of one limb pair, divided by ``2**FIXED_BITS`` (correctly rounded)."""
    hi, lo = int(limbs[row, 0]), int(limbs[row, 1])
    return ((hi << LIMB_BITS) + lo) / (1 << FIXED_BITS)


@njit(nogil=True, cache=True)
def auc_area(pos_hist, neg_hist):
    """The ROC area of the histograms before its division by ``P * N`` (see
    ``functions.auc_from_histograms``): one pass, a bucket without negatives adds nothing.

    Most of a pass's 2**20 buckets are empty; numpy's cumsum and dot over all of them cost
    ~15 ms per metrics computation, this loop ~1 ms.
    """
    above = pos_hist[0] - pos_hist[0]  # the counts' own type: exact for integer counts
    for i in range(pos_hist.size):
        above += pos_hist[i]
    area = 0.0
    for i in range(pos_hist.size):
        positives = pos_hist[i]
        above -= positives
        negatives = neg_hist[i]
        if negatives != 0:
            area += float(negatives) * (float(above) + 0.5 * float(positives))
    return area


@njit(nogil=True, cache=True)
def bucket_error(pos_hist, neg_hist, max_span, error_bound):
    """Paddle's bucket error over the histograms (see ``functions.bucket_error_from_histograms``)."""
    size = pos_hist.size
    last_ctr = -1.0
    impressions = 0.0
    ctr_sum = 0.0
    clicks = 0.0
    error_sum = 0.0
    error_count = 0.0
    for i in range(size):
        ctr = i / size
        if abs(ctr - last_ctr) > max_span:
            # open a new adaptive bucket starting at this prediction value
            last_ctr = ctr
            impressions = 0.0
            ctr_sum = 0.0
            clicks = 0.0
        samples = pos_hist[i] + neg_hist[i]
        if samples == 0:
            # nothing added: the pool's estimate is the one already found not trustworthy
            # (or none): skipping the check is exact, and most buckets are empty
            continue
        show = float(samples)
        impressions += show
        ctr_sum += ctr * show
        clicks += float(pos_hist[i])
        if impressions <= 0.0:
            continue
        adjust_ctr = ctr_sum / impressions
        if adjust_ctr <= 0.0:
            continue  # relative error of a zero CTR estimate is unbounded: keep growing
        relative_error = math.sqrt((1.0 - adjust_ctr) / (adjust_ctr * impressions))
        if relative_error < error_bound:
            # enough impressions for a trustworthy CTR estimate: close this bucket
            actual_ctr = clicks / impressions
            error_sum += abs(actual_ctr / adjust_ctr - 1.0) * impressions
            error_count += impressions
            last_ctr = -1.0
    return error_sum / error_count if error_count > 0.0 else 0.0
