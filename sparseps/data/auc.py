"""Exact ROC AUC (rank-based, ties averaged): the reference for generated data.

Kept here, small and dependency-free, so the data package needs nothing from the
metrics package; the bucketed, distributed AUC of training is tested against this kind
of exact computation.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

__all__ = ["exact_auc"]


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Probability that a random positive scores above a random negative (ties count 1/2).

    Args:
        labels: 0/1 (or bool) ``[n]``; anything > 0.5 is positive.
        scores: ``[n]`` scores.

    Returns:
        the AUC, or NaN when all labels are equal.

    Raises:
        InputError: the shapes differ.
    """
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise InputError(f"exact_auc: labels {labels.shape} and scores {scores.shape} differ")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    # average rank of each distinct score (1-based), then the Mann-Whitney U statistic
    unique, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    average_rank = upper - (counts - 1) / 2.0
    rank_sum = float(average_rank[inverse][labels].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)
