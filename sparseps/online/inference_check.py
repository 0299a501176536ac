"""The inference check of an online job (``save.check_inference``): after an inference
save, the saved model must predict what the trainer predicts on the pass's data.

A save that serving would load wrong is caught at the pass that wrote it, not by its
users. Kept apart from the pass loop: it is a check of the inference files (the
checkpoint package's :class:`~sparseps.checkpoint.predictor.Predictor` against the
trainer), not a step of the schedule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core import collectives
from ..errors import CheckpointError

__all__ = ["INFERENCE_TOLERANCE", "check_inference"]

INFERENCE_TOLERANCE = 1e-6


def check_inference(trainer, inference_dir: Path, dataset, folders) -> float:
    """Max |inference model - trainer| prediction on this worker's share ``dataset`` of the
    pass's ``folders``, the largest of every worker's (collective).

    Raises:
        CheckpointError: the two disagree on the number of predictions, or by more than
            :data:`INFERENCE_TOLERANCE`.
    """
    from ..checkpoint.predictor import Predictor

    mine = trainer.infer_from_dataset(dataset).predictions
    # every worker holds the same inference files; each checks its own share
    served = Predictor(inference_dir).predict(dataset)
    if served.shape != mine.shape:
        raise CheckpointError(
            f"inference check: {served.size} predictions from the inference model, "
            f"{mine.size} from the trainer"
        )
    diff = float(np.max(np.abs(served - mine))) if mine.size else 0.0
    worst = collectives.all_gather_arrays(np.array([diff], np.float64))
    diff = float(max(a[0] for a in worst))
    if diff > INFERENCE_TOLERANCE:
        raise CheckpointError(
            f"inference check: the inference model in {inference_dir} differs from the "
            f"trainer by up to {diff:.3g} (> {INFERENCE_TOLERANCE}) on {folders[0]}..."
        )
    return diff
