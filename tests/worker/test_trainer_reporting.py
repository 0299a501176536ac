"""What the trainer reports: progress lines, pass lines, TensorBoard, UAUC, dumps.

Runs in local mode (this process = worker 0 of 1). Values are checked against what the
predictions (read back from the trainer's own dump) imply.
"""

from __future__ import annotations

import importlib.util
import logging
import re

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.metrics import (
    CTRMetrics,
    DumpConfig,
    ReportConfig,
    grouped_auc,
    read_dump,
    read_jsonl,
)
from sparseps.worker.reporting import PROGRESS_BUCKETS

SLOTS = ("C1", "C2", "C3")
PROGRESS = re.compile(
    r"^time: \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\], batch: \[(\d+)\], loss: \[(\d+\.\d{6})\], "
    r"auc: \[(\d\.\d{6})\], samples/s: \[(\d+)\]$"
)


def _trainer(report: ReportConfig, mode: str = "sync") -> sps.Trainer:
    torch.manual_seed(0)
    model = sps.models.DNN(SLOTS, 2, emb_dim=4, hidden=(8,))
    return sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode=mode), report=report)


def _first_ids(batches, slot):
    """The reference grouping: first id of ``slot`` per sample, 0 when it has none."""
    out = []
    for b in batches:
        s = b.slots[slot]
        out.append([int(s.values[s.offsets[i]]) if s.offsets[i + 1] > s.offsets[i] else 0
                    for i in range(len(b))])  # fmt: skip
    return np.concatenate(out).astype(np.uint64)


def test_progress_lines_have_the_seed_format_and_window_values(
    local_worker, planted, tmp_path, caplog
):
    batches = planted(5, 5, 32, SLOTS)
    dump = DumpConfig(str(tmp_path / "dump"), fields=("sample_id", "label", "pred"))
    trainer = _trainer(ReportConfig(dump=dump))
    with caplog.at_level(logging.INFO, logger="sparseps.worker"):
        trainer.train_from_dataset(batches, print_period=2)
    trainer.stop()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("time: [")]
    parsed = [PROGRESS.match(line) for line in lines]
    assert all(parsed), lines
    assert [int(m.group(2)) for m in parsed] == [2, 4]  # every 2 batches; 5th is no window
    fields = read_dump(tmp_path / "dump" / "pass-00000")
    # the dump's sample ids are the batches' int64 ids (docs/metrics.md)
    assert fields["sample_id"].dtype == np.int64
    np.testing.assert_array_equal(fields["sample_id"], np.concatenate([b.ids for b in batches]))
    pred = fields["pred"].astype(np.float64)
    label = fields["label"]
    per_sample = -(label * np.log(pred) + (1 - label) * np.log(1 - pred))
    for m, window in zip(parsed, (slice(0, 64), slice(64, 128)), strict=True):
        # loss: mean over the window's batches of each batch's mean loss (32 samples each)
        batch_means = per_sample[window].reshape(2, 32).mean(axis=1)
        assert float(m.group(3)) == pytest.approx(batch_means.mean(), abs=2e-6)
        # auc: this worker's window, at the progress resolution
        ref = CTRMetrics(num_buckets=PROGRESS_BUCKETS)
        ref.update(fields["pred"][window], label[window])
        assert m.group(4) == f"{ref.compute().auc:.6f}"
        assert int(m.group(5)) > 0


def test_pass_lines_list_the_metrics_after_pass_and_phase(local_worker, planted, caplog):
    trainer = _trainer(ReportConfig())
    with caplog.at_level(logging.INFO, logger="sparseps.worker"):
        train = trainer.train_from_dataset(planted(6, 3, 32, SLOTS), print_period=0)
        test = trainer.evaluate(planted(7, 2, 32, SLOTS))
    trainer.stop()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pass: [")]
    assert len(lines) == 2, lines
    assert lines[0].startswith(
        f"pass: [0], phase: [train], auc: [{train.metrics.auc:.6f}], bucket_error: ["
    )
    # the evaluation of pass 0's model is numbered 0, like the pass it measured
    assert lines[1].startswith(f"pass: [0], phase: [test], auc: [{test.auc:.6f}], ")
    assert lines[0].endswith(f"ins_num: [{train.metrics.count}]") and train.metrics.count == 96
    assert not any(", ," in line for line in lines)


def test_pass_lines_number_the_pass_they_report(local_worker, planted, tmp_path, caplog):
    trainer = _trainer(ReportConfig(metrics_path=str(tmp_path / "metrics.jsonl")))
    with caplog.at_level(logging.INFO, logger="sparseps.worker"):
        trainer.evaluate(planted(5, 1, 32, SLOTS))  # before any training: the initial model
        for p in range(2):
            trainer.train_from_dataset(planted(6 + p, 2, 32, SLOTS), print_period=0)
            trainer.evaluate(planted(9, 1, 32, SLOTS))
    trainer.stop()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pass: [")]
    heads = [re.match(r"pass: \[(\d+)\], phase: \[(\w+)\]", line).groups() for line in lines]
    want = [("0", "test"), ("0", "train"), ("0", "test"), ("1", "train"), ("1", "test")]
    assert heads == want, lines
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(str(r["pass"]), r["phase"]) for r in records] == want


def test_uauc_of_a_grouping_slot_and_the_bucket_count(local_worker, planted, tmp_path):
    train_batches, test_batches = planted(8, 4, 64, SLOTS), planted(9, 2, 64, SLOTS)
    dump = DumpConfig(str(tmp_path / "dump"), fields=("pred", "label", "C2"))
    trainer = _trainer(ReportConfig(group_slot="C2", num_buckets=8, dump=dump))
    result = trainer.train_from_dataset(train_batches, print_period=0).metrics
    inferred = trainer.infer_from_dataset(test_batches)
    trainer.stop()
    fields = read_dump(tmp_path / "dump" / "pass-00000")
    values, offsets = fields["C2"]
    has = offsets[1:] > offsets[:-1]
    groups = np.where(has, values[np.minimum(offsets[:-1], len(values) - 1)], 0)
    np.testing.assert_array_equal(groups, _first_ids(train_batches, "C2"))
    want = grouped_auc(fields["pred"], fields["label"], groups)
    assert (result.uauc, result.gauc, result.groups) == pytest.approx(tuple(want), abs=1e-12)
    assert 5 < result.groups <= 30
    # the AUC uses the configured 8 buckets (coarse: differs from a fine histogram)
    coarse, fine = CTRMetrics(num_buckets=8), CTRMetrics()
    for m in (coarse, fine):
        m.update(fields["pred"], fields["label"])
    assert result.auc == coarse.compute().auc != fine.compute().auc
    # evaluation groups the same way
    want = grouped_auc(inferred.predictions, inferred.labels, _first_ids(test_batches, "C2"))
    assert inferred.metrics.uauc == pytest.approx(want.uauc, abs=1e-12)
    assert inferred.metrics.gauc == pytest.approx(want.gauc, abs=1e-12)


def test_grouping_slot_missing_from_the_batch_is_named(local_worker, planted):
    trainer = _trainer(ReportConfig(group_slot="user"))
    with pytest.raises(sps.InputError, match="group_slot 'user' is not a slot of the batch"):
        trainer.train_from_dataset(planted(1, 1, 8, SLOTS), print_period=0)
    trainer.stop()


def test_tensorboard_scalars_of_each_pass(local_worker, planted, tmp_path):
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is in the dev extras")
    trainer = _trainer(ReportConfig(tensorboard_dir=str(tmp_path / "tb")), mode="async")
    passes = [trainer.train_from_dataset(planted(p, 3, 32, SLOTS), print_period=0)
              for p in range(2)]  # fmt: skip
    test = trainer.evaluate(planted(9, 2, 32, SLOTS))
    trainer.stop()  # closes (flushes) the event files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    auc = [(e.step, e.value) for e in events.Scalars("train/auc")]
    assert [s for s, _ in auc] == [0, 1]
    for (_, value), result in zip(auc, passes, strict=True):
        assert value == pytest.approx(result.metrics.auc, abs=1e-6)  # stored as float32
    assert [e.value for e in events.Scalars("train/count")] == [96.0, 96.0]
    (point,) = events.Scalars("test/logloss")
    assert point.step == 1 and point.value == pytest.approx(test.logloss, rel=1e-6)  # pass 1


def test_report_config_is_validated():
    with pytest.raises(sps.ConfigError, match="ReportConfig.num_buckets"):
        ReportConfig(num_buckets=0)
    with pytest.raises(sps.ConfigError, match="ReportConfig.group_slot"):
        ReportConfig(group_slot="")
    with pytest.raises(sps.ConfigError, match="Trainer.report"):
        sps.Trainer(sps.models.DNN(SLOTS, 2, hidden=(4,)), report={"metrics_path": "x"})
