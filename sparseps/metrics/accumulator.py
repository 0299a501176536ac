"""The CTR metric bundle: a stateful accumulator over batches, workers and passes.

:class:`CTRMetrics` keeps everything a pass needs in integer form:

- two int64 histograms of ``num_buckets`` prediction buckets (positives, negatives),
  from which AUC, bucket error, instance count and clicks follow;
- four fixed-point sums (predictions, absolute errors, squared errors, logloss) held as
  int64 limb pairs (see :mod:`sparseps.metrics._kernels`);
- the count of samples classified correctly at ``threshold`` (for accuracy);
- when grouping ids are given, the grouped samples themselves (for UAUC / GAUC).

Because all of it is integer, adding batches in any order, merging accumulators, or
all-reducing them over workers gives the *same bits*; ``compute(global_=True)`` on W
workers equals ``compute()`` of one accumulator that saw all the data.

Memory: ``16 * num_buckets`` bytes (16 MiB at the default 2**20), plus 17 bytes per
grouped sample kept locally; a global grouped compute gathers every worker's grouped
samples on every worker (24 bytes each on the wire, about 60 bytes each while sorting).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError
from . import _kernels, distributed
from .functions import (
    auc_from_histograms,
    bucket_error_from_histograms,
    check_inputs,
    check_num_buckets,
    check_threshold,
    count_correct,
    grouped_auc,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["DEFAULT_NUM_BUCKETS", "CTRMetrics", "MetricResult"]

DEFAULT_NUM_BUCKETS = 1 << 20


@dataclass(frozen=True)
class MetricResult:
    """The metrics of one pass (or window), local or global. Never NaN.

    Attributes:
        auc: bucketed AUC; 0.5 when not defined (see ``auc_defined``).
        auc_defined: False when there were no positives or no negatives.
        bucket_error: calibration error in adaptive buckets (Paddle's definition).
        logloss: mean binary cross-entropy, predictions clipped to [1e-7, 1 - 1e-7].
        mae: mean |pred - label|.  rmse: sqrt(mean (pred - label)**2).
        mse: mean (pred - label)**2 (``rmse ** 2`` up to rounding; fleet.metrics.mse).
        accuracy: share of samples with ``(pred >= threshold) == label`` (fleet.metrics.acc).
        threshold: the accumulator's classification threshold (default 0.5).
        actual_ctr: clicks / count.  predicted_ctr: sum(pred) / count.
        copc: clicks / sum(pred) (actual over predicted clicks); 0.0 if sum(pred) == 0.
        count: number of samples (instances).  clicks: number of positive samples.
        uauc: mean of per-group AUCs over groups with both classes; None without groups.
        gauc: the same mean weighted by group size; None without groups.
        groups: number of groups that entered uauc/gauc.
    All rates are 0.0 when ``count == 0``.
    """

    auc: float
    auc_defined: bool
    bucket_error: float
    logloss: float
    mae: float
    rmse: float
    actual_ctr: float
    predicted_ctr: float
    copc: float
    count: int
    clicks: int
    uauc: float | None = None
    gauc: float | None = None
    groups: int = 0
    mse: float = 0.0
    accuracy: float = 0.0
    threshold: float = 0.5

    def to_dict(self) -> dict[str, float | int | bool | None]:
        """Plain Python values, ready for JSON."""
        return asdict(self)


class CTRMetrics:
    """Accumulates AUC buckets and CTR statistics; computes local or global metrics.

    Example::

        m = CTRMetrics()
        for batch in data:
            m.update(probabilities, labels)                # or group=user_ids
        result = m.compute(global_=True)                   # same value on every worker

    Args:
        num_buckets: AUC histogram resolution (predictions are bucketed by
            ``floor(p * num_buckets)``). The bucketed AUC differs from the exact one only
            through pairs whose predictions fall in the same bucket.
        threshold: a prediction ``>= threshold`` counts as positive for ``accuracy``.
    """

    def __init__(self, num_buckets: int = DEFAULT_NUM_BUCKETS, *, threshold: float = 0.5) -> None:
        self._num_buckets = check_num_buckets(num_buckets)
        self._threshold = check_threshold(threshold)
        self.reset()

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def num_buckets(self) -> int:
        return self._num_buckets

    @property
    def count(self) -> int:
        """Samples added on this worker since the last reset."""
        return self._count

    def reset(self) -> None:
        """Forget every sample (start a new pass or window)."""
        self._pos = np.zeros(self._num_buckets, np.int64)
        self._neg = np.zeros(self._num_buckets, np.int64)
        self._limbs = np.zeros((_kernels.NUM_SUMS, 2), np.int64)
        self._count = 0
        self._correct = 0
        self._grouped: bool | None = None  # unknown until the first non-empty update
        self._group_chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def update(self, pred: object, label: object, group: object = None) -> None:
        """Add one batch.

        Args:
            pred: probabilities in [0, 1], shape [n] or [n, 1].
            label: 0/1 labels, same length.
            group: optional integer grouping ids (e.g. user ids) for UAUC / GAUC. Give it
                on every update of every worker, or never.

        Raises:
            InputError: malformed arrays (see :func:`check_inputs`), or grouping ids given
                on some updates and not on others.
        """
        p, y, g = check_inputs(pred, label, group, where="CTRMetrics.update")
        if p.size == 0:
            return
        self._check_grouping(g is not None)
        _kernels.accumulate(p, y, self._num_buckets, self._pos, self._neg, self._limbs)
        _kernels.normalize_limbs(self._limbs)
        self._count += p.size
        self._correct += count_correct(p, y, self._threshold)
        if g is not None:
            self._group_chunks.append((g.copy(), p.copy(), y.copy()))

    def _check_grouping(self, grouped: bool) -> None:
        if self._grouped is None:
            self._grouped = grouped
        elif self._grouped != grouped:
            raise InputError(
                "CTRMetrics.update: grouping ids were given for some batches and not for "
                "others; pass group= on every update (or on none) so UAUC covers all samples"
            )

    def merge(self, other: CTRMetrics) -> CTRMetrics:
        """Add ``other``'s samples to this accumulator (in place); returns self."""
        if not isinstance(other, CTRMetrics):
            raise InputError(f"CTRMetrics.merge: expected a CTRMetrics, got {type(other).__name__}")
        if other.num_buckets != self.num_buckets:
            raise InputError(
                f"CTRMetrics.merge: num_buckets differ ({self.num_buckets} vs "
                f"{other.num_buckets}); use the same bucket count everywhere"
            )
        if other.threshold != self.threshold:
            raise InputError(
                f"CTRMetrics.merge: thresholds differ ({self.threshold} vs {other.threshold})"
            )
        if other._count == 0:
            return self
        self._check_grouping(bool(other._grouped))
        self._pos += other._pos
        self._neg += other._neg
        self._limbs += other._limbs
        _kernels.normalize_limbs(self._limbs)
        self._count += other._count
        self._correct += other._correct
        self._group_chunks.extend(other._group_chunks)
        return self

    def _grouped_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self._group_chunks:
            return np.zeros(0, np.uint64), np.zeros(0, np.float64), np.zeros(0, np.uint8)
        if len(self._group_chunks) > 1:  # consolidate once, later calls reuse the result
            ids, preds, labels = (np.concatenate(c) for c in zip(*self._group_chunks, strict=True))
            self._group_chunks = [(ids, preds, labels)]
        return self._group_chunks[0]

    def state(self) -> dict[str, np.ndarray]:
        """A copy of the accumulator state as numpy arrays (see :meth:`from_state`).

        Keys: ``pos``, ``neg`` (int64 [B] histograms), ``sums`` (int64 [4, 2] fixed-point
        limbs of pred, |err|, err**2, logloss), ``group_id`` (uint64 [m]),
        ``group_pred`` (float64 [m]), ``group_label`` (uint8 [m]), ``correct`` (int64 [1],
        samples classified correctly at the threshold), ``threshold`` (float64 [1]).
        """
        ids, preds, labels = self._grouped_arrays()
        return {
            "pos": self._pos.copy(),
            "neg": self._neg.copy(),
            "sums": self._limbs.copy(),
            "group_id": ids.copy(),
            "group_pred": preds.copy(),
            "group_label": labels.copy(),
            "correct": np.array([self._correct], np.int64),
            "threshold": np.array([self._threshold], np.float64),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray]) -> CTRMetrics:
        """Rebuild an accumulator from :meth:`state` (e.g. saved with ``np.savez``)."""
        missing = {"pos", "neg", "sums", "group_id", "group_pred", "group_label"} - set(state)
        if missing:
            raise InputError(f"CTRMetrics.from_state: missing keys {sorted(missing)}")
        pos = np.asarray(state["pos"], np.int64)
        threshold = float(np.asarray(state.get("threshold", [0.5])).reshape(-1)[0])
        metrics = cls(num_buckets=pos.size, threshold=threshold)
        neg = np.asarray(state["neg"], np.int64)
        sums = np.asarray(state["sums"], np.int64)
        if neg.shape != pos.shape or sums.shape != (_kernels.NUM_SUMS, 2):
            raise InputError("CTRMetrics.from_state: pos/neg/sums have inconsistent shapes")
        metrics._pos[:], metrics._neg[:], metrics._limbs[:] = pos, neg, sums
        metrics._count = int(pos.sum() + neg.sum())
        # states saved before accuracy existed lack "correct": accuracy then reads 0
        metrics._correct = int(np.asarray(state.get("correct", [0])).reshape(-1)[0])
        ids = np.asarray(state["group_id"], np.uint64)
        if ids.size:
            if ids.size != metrics._count:
                raise InputError("CTRMetrics.from_state: group arrays do not cover every sample")
            preds = np.asarray(state["group_pred"], np.float64)
            labels = np.asarray(state["group_label"], np.uint8)
            metrics._group_chunks = [(ids.copy(), preds.copy(), labels.copy())]
        if metrics._count:
            metrics._grouped = bool(ids.size)
        return metrics

    def compute(
        self,
        *,
        global_: bool = False,
        process_group: ProcessGroup | None = None,
        timeout: float = distributed.DEFAULT_TIMEOUT_S,
    ) -> MetricResult:
        """Metrics of the samples added so far; the accumulator is left unchanged.

        Args:
            global_: combine every worker's state first (a collective: all workers of the
                group must call it). Without an initialised process group this is the
                local result.
            process_group: a ``torch.distributed`` group; default: the default group.
            timeout: seconds to wait for the other workers.

        Raises:
            InputError: (global) some workers gave grouping ids and others did not.
            DeadlineError, UnavailableError: (global) a worker did not take part.
        """
        pos, neg, limbs, correct = self._pos, self._neg, self._limbs, self._correct
        ids, preds, labels = self._grouped_arrays()
        if global_ and distributed.group_size(process_group) > 1:
            b = self._num_buckets
            packed = np.concatenate(
                [pos, neg, limbs.ravel(), [ids.size, self._count, self._correct]]
            )
            total = distributed.all_reduce_sum(packed, group=process_group, timeout=timeout)
            pos, neg = total[:b], total[b : 2 * b]
            limbs = _kernels.normalize_limbs(total[2 * b : -3].reshape(limbs.shape))
            grouped, count, correct = int(total[-3]), int(total[-2]), int(total[-1])
            if grouped and grouped != count:
                raise InputError(
                    f"CTRMetrics.compute: grouping ids were given for {grouped} of {count} "
                    "samples across workers; pass group= on every worker's updates or none"
                )
            if grouped:
                rows = np.stack(
                    [ids.view(np.int64), preds.view(np.int64), labels.astype(np.int64)], 1
                )
                rows = distributed.all_gather_rows(rows, group=process_group, timeout=timeout)
                ids = np.ascontiguousarray(rows[:, 0]).view(np.uint64)
                preds = np.ascontiguousarray(rows[:, 1]).view(np.float64)
                labels = rows[:, 2].astype(np.uint8)
        grouped_arrays = (ids, preds, labels) if ids.size else None
        return _result(pos, neg, limbs, grouped_arrays, correct, self._threshold)


def _result(
    pos: np.ndarray,
    neg: np.ndarray,
    limbs: np.ndarray,
    grouped: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    correct: int,
    threshold: float,
) -> MetricResult:
    clicks = int(pos.sum())
    count = clicks + int(neg.sum())
    uauc = gauc = None
    groups = 0
    if grouped is not None:
        ids, preds, labels = grouped
        uauc, gauc, groups = grouped_auc(preds, labels, ids)
    if count == 0:
        return MetricResult(
            0.5, False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, uauc, gauc, groups,
            threshold=threshold,
        )  # fmt: skip
    pred_sum = _kernels.limbs_to_float(limbs, _kernels.SUM_PRED)
    mse = _kernels.limbs_to_float(limbs, _kernels.SUM_SQRERR) / count
    return MetricResult(
        auc=auc_from_histograms(pos, neg),
        auc_defined=0 < clicks < count,
        bucket_error=bucket_error_from_histograms(pos, neg),
        logloss=_kernels.limbs_to_float(limbs, _kernels.SUM_LOGLOSS) / count,
        mae=_kernels.limbs_to_float(limbs, _kernels.SUM_ABSERR) / count,
        rmse=math.sqrt(mse),
        actual_ctr=clicks / count,
        predicted_ctr=pred_sum / count,
        copc=clicks / pred_sum if pred_sum > 0 else 0.0,
        count=count,
        clicks=clicks,
        uauc=uauc,
        gauc=gauc,
        groups=groups,
        mse=mse,
        accuracy=correct / count,
        threshold=threshold,
    )
