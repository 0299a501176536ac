"""Deprecated: the exact AUC lives in :func:`sparseps.metrics.functions.exact_auc`.

That is the one rule (``exact_auc(pred, label)``, 0.5 when one class is missing). This
labels-first alias stays only while ``sparseps/data/synthetic.py``, which another change
is editing now, still calls ``exact_auc(label, prob)`` from here; call the metrics one.
"""

from __future__ import annotations

import numpy as np

from ..metrics.functions import exact_auc as _exact_auc

__all__ = ["exact_auc"]


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Deprecated alias: ``sparseps.metrics.functions.exact_auc(scores, labels)``."""
    return _exact_auc(scores, labels)
