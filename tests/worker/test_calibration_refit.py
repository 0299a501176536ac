"""The calibration refit of the demo job (issue 29) against a real trainer, in local mode."""

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.models import WideDeep
from sparseps.models._blocks import set_output_bias
from sparseps.models.calibration import ProgressiveCalibrator


def test_refit_measures_the_final_model_on_the_kept_rows(local_worker, planted):
    """``refit`` predicts the kept rows again with the model as training left it: a change
    made after the pass (here a logit offset of 0.7) moves its shift by exactly that much,
    which the predictions made during the pass could not show; with its shift in place the
    final model's predicted clicks on those rows equal their clicks."""
    torch.manual_seed(0)
    slots = ("C1", "C2", "C3")
    model = WideDeep(slots, 2, emb_dim=4, hidden=(8,))
    set_output_bias(model, 0.3)
    trainer = sps.Trainer(model, strategy=sps.Strategy(mode="sync"))
    batches = planted(3, 12, 256, slots)
    calibrator = ProgressiveCalibrator(rows=1024, spread=False)
    trainer.train_from_dataset(batches, print_period=0, on_batch=calibrator)
    progressive = calibrator.shift()
    shift = calibrator.refit(trainer)
    kept = batches[-4:]
    labels = np.concatenate([b.label for b in kept])
    assert calibrator.local()[1] == labels.size  # the last 1024 rows are the kept ones
    model.head.logit_shift.fill_(0.7)
    assert calibrator.refit(trainer) == pytest.approx(shift - 0.7, abs=0.01)
    assert calibrator.shift() == progressive  # the pass's own predictions are unchanged
    model.head.logit_shift.fill_(shift)
    preds = trainer.infer_from_dataset(kept).predictions
    assert preds.sum() == pytest.approx(labels.sum(), rel=0.01)
    trainer.stop()
