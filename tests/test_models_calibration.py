"""Calibration of the mean prediction (issue 29): the progressive calibrator's shift."""

import numpy as np
import pytest
import torch

from sparseps.checkpoint.inference import export_head
from sparseps.models import WideDeep
from sparseps.models._blocks import set_output_bias
from sparseps.models.calibration import ProgressiveCalibrator, predicted_clicks, solve_shift
from sparseps.worker.trainer import Step


def _steps(preds, labels, size=512):
    for start in range(0, preds.size, size):
        p = preds[start : start + size, None].astype(np.float32)
        y = labels[start : start + size, None].astype(np.float32)
        yield Step(None, 0.0, p, y)


def test_shift_makes_predicted_clicks_equal_clicks():
    rng = np.random.default_rng(0)
    true_logit = rng.normal(-4.0, 1.5, 200_000)
    labels = (rng.random(true_logit.size) < 1 / (1 + np.exp(-true_logit))).astype(np.float32)
    preds = 1 / (1 + np.exp(-(true_logit + 0.4)))  # over-predicts: COPC about 0.7
    calibrator = ProgressiveCalibrator(rows=50_000, spread=False)
    for step in _steps(preds, labels):
        calibrator(step)
    kept = calibrator.local()
    assert 50_000 <= kept[1] < 50_000 + 512  # only the last rows are kept
    shift = calibrator.shift()
    assert shift == pytest.approx(-0.4, abs=0.06)
    tail_p, tail_y = preds[-int(kept[1]) :], labels[-int(kept[1]) :]
    shifted = 1 / (1 + np.exp(-(np.log(tail_p / (1 - tail_p)) + shift)))
    assert shifted.sum() == pytest.approx(tail_y.sum(), rel=1e-3)
    # two workers' halves give the global shift through the all-reduce
    halves = [ProgressiveCalibrator(rows=25_000, spread=False) for _ in range(2)]
    for i, step in enumerate(_steps(preds[-50_000:], labels[-50_000:])):
        halves[i % 2](step)
    total = halves[0].local() + halves[1].local()
    assert solve_shift(total[2:], total[0]) == pytest.approx(shift, abs=0.02)


def test_shift_is_zero_without_clicks_and_clamped_to_the_grid():
    assert ProgressiveCalibrator(100).shift() == 0.0
    grid_sums = predicted_clicks(np.full(10, 0.5))
    assert solve_shift(grid_sums, 0.0) == 0.0
    assert solve_shift(grid_sums, 10.0) == 3.0  # all clicks: the largest shift on the grid


def test_wide_deep_head_adds_the_shift_and_the_prior_bias():
    torch.manual_seed(0)
    model = WideDeep(["C1", "C2"], 3, emb_dim=4, hidden=(8,))
    dense, deep, wide = torch.zeros(5, 3), torch.zeros(5, 2, 4), torch.zeros(5, 2, 1)
    before = model.head(dense, deep, wide)
    model.head.logit_shift.fill_(0.25)
    assert torch.allclose(model.head(dense, deep, wide), before + 0.25)
    logit = set_output_bias(model, 0.01)
    assert logit == pytest.approx(np.log(0.01 / 0.99))
    assert model.head.deep[-1].bias.item() == pytest.approx(logit)
    assert "logit_shift" not in dict(model.head.named_parameters())
    exported = export_head(model).module()  # an inference save's head keeps the shift
    assert torch.allclose(exported(dense, deep, wide), model.head(dense, deep, wide))


def test_spread_keeps_whole_batches_drawn_over_the_pass():
    """The default keeps ``rows`` rows as whole batches sampled over the whole pass (a
    reservoir: early batches as likely as late ones), the same ones for the same seed."""

    def kept_batches(seed):
        calibrator = ProgressiveCalibrator(rows=20 * 512, seed=seed)
        for i in range(400):  # batch i's predictions all equal i, to tell them apart
            calibrator(Step(None, 0.0, np.full((512, 1), i, np.float32), np.zeros((512, 1))))
        assert calibrator.local()[1] == 20 * 512
        return sorted({int(p[0]) for p, _, _ in calibrator._batches})

    kept = kept_batches(0)
    assert len(kept) == 20 and kept == kept_batches(0) and kept != kept_batches(1)
    assert min(kept) < 100 and max(kept) >= 300  # from the start to the end of the pass
    assert sum(i < 200 for i in kept) in range(5, 16)  # about half from each half
