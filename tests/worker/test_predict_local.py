"""The trainer's loss, multi-task metrics, user statistics and distributed prediction, in
local mode (this process = worker 0 of 1, one background server).

- a user loss function changes what is minimised, not how metrics are read;
- a two-task loss reports one metric set per task;
- ``on_batch`` statistics reduce to the numbers of the batches;
- ``predict_from_dataset`` writes every sample once with its key and named outputs,
  without growing or changing any table, and ``unique_keys`` keeps one row per key.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sparseps as sps
from sparseps.data.schema import Batch
from sparseps.errors import CheckpointError, ConfigError
from sparseps.models import DNN, TwoTower
from sparseps.worker.losses import Loss, LossOutput, label_column
from sparseps.worker.predict import read_manifest, read_predictions

SLOTS = ("C1", "C2", "C3")


def _model():
    torch.manual_seed(0)
    return DNN(SLOTS, 2, emb_dim=4, hidden=(8,))


def test_user_loss_and_statistics(local_worker, planted):
    calls = []

    def weighted_bce(logits, batch):
        calls.append(len(batch))
        labels = torch.from_numpy(batch.label)
        return F.binary_cross_entropy_with_logits(logits, labels, reduction="none") * 2.0

    trainer = sps.Trainer(_model(), strategy=sps.Strategy(mode="sync"), loss=weighted_bce)
    batches = planted(0, 6, 64, SLOTS)

    def on_batch(step, stats):
        stats.add("clicks", step.labels.sum())
        stats.add("max_pred", step.predictions.max(), op="max")
        stats.add("min_pred", torch.from_numpy(step.predictions.min(0)), op="min")
        stats.add("rows", np.array([len(step.batch), 1.0]))

    result = trainer.train_from_dataset(batches, print_period=0, on_batch=on_batch)
    assert calls == [64] * 6
    labels = np.concatenate([b.label for b in batches])
    assert result.stats["clicks"] == pytest.approx(labels.sum())
    assert isinstance(result.stats["clicks"], float)
    assert result.stats["rows"].tolist() == [384.0, 6.0]
    assert 0 <= result.stats["min_pred"][0] <= result.stats["max_pred"] <= 1
    assert result.metrics.count == 384 and result.tasks == {}
    trainer.stop()


class TwoTasks(Loss):
    """CTR on batch.label and a second task on extra label column 1."""

    tasks = ("ctr", "cvr")

    def __call__(self, model, batch):
        logits = model(batch).reshape(-1)
        second = -logits  # a second head is not needed to test the plumbing
        y1 = torch.from_numpy(label_column(batch, 0))
        y2 = torch.from_numpy(label_column(batch, 1))
        loss = F.binary_cross_entropy_with_logits(logits, y1, reduction="sum")
        loss = loss + F.binary_cross_entropy_with_logits(second, y2, reduction="sum")
        preds = torch.sigmoid(torch.stack([logits, second], 1)).detach().numpy()
        return LossOutput(loss, preds, torch.stack([y1, y2], 1).numpy())


def _with_second_label(batches):
    out = []
    for b in batches:
        extra = (1.0 - b.label).reshape(-1, 1).astype(np.float32)
        out.append(Batch(b.label, b.dense, b.slots, b.ids, extra))
    return out


def test_multi_task_metrics(local_worker, planted):
    trainer = sps.Trainer(_model(), strategy=sps.Strategy(mode="sync"), loss=TwoTasks())
    batches = _with_second_label(planted(0, 4, 64, SLOTS))
    result = trainer.train_from_dataset(batches, print_period=0)
    assert set(result.tasks) == {"ctr", "cvr"} and result.tasks["ctr"] == result.metrics
    # the second task is the first one mirrored: the same AUC
    assert result.tasks["cvr"].auc == pytest.approx(result.metrics.auc, abs=1e-3)
    infer = trainer.infer_from_dataset(batches)
    assert infer.predictions.shape == (256, 2) and set(infer.tasks) == {"ctr", "cvr"}
    trainer.stop()


def test_predict_writes_each_sample_and_no_row(local_worker, planted, tmp_path):
    trainer = sps.Trainer(_model(), strategy=sps.Strategy(mode="sync"))
    train = planted(0, 4, 64, SLOTS)
    trainer.train_from_dataset(train, print_period=0)
    before = trainer.client.stats()["total"]["tables"]
    fresh = planted(5, 3, 50, SLOTS, vocab=200)  # ids never trained: pulls must not create rows
    infer = trainer.infer_from_dataset(fresh)
    result = trainer.predict_from_dataset(fresh, tmp_path / "pred", key="C1", rows_per_part=60)
    assert trainer.client.stats()["total"]["tables"] == before
    table = read_predictions(tmp_path / "pred")
    manifest = read_manifest(tmp_path / "pred")
    assert result.rows == table.num_rows == 150 == manifest["rows"]
    assert len(manifest["parts"]) == result.parts == 2  # 100 rows (2 batches >= 60), then 50
    np.testing.assert_allclose(table.column("pred").to_numpy(), infer.predictions, atol=1e-6)
    first = np.concatenate([_first_ids(b, "C1") for b in fresh])
    assert (table.column("key").to_numpy() == first).all()
    with pytest.raises(ConfigError, match="named_outputs"):
        trainer.predict_from_dataset(fresh, tmp_path / "p2", key="C1", outputs=("x",))
    (tmp_path / "pred" / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="not a complete"):
        read_predictions(tmp_path / "pred")
    trainer.stop()


def _first_ids(batch, slot):
    s = batch.slots[slot]
    has = s.offsets[1:] > s.offsets[:-1]
    out = np.zeros(len(batch), np.uint64)
    out[has] = s.values[s.offsets[:-1][has]]
    return out


def test_two_tower_outputs_unique_keys(local_worker, planted, tmp_path):
    torch.manual_seed(0)
    model = TwoTower(("C1",), ("C2", "C3"), emb_dim=4, hidden=(8,), out_dim=4)
    trainer = sps.Trainer(model, strategy=sps.Strategy(mode="sync"))
    data = planted(1, 3, 64, SLOTS, vocab=10)
    trainer.predict_from_dataset(data, tmp_path / "items", key="C2", outputs=("item_vec",),
                                 unique_keys=True)  # fmt: skip
    table = read_predictions(tmp_path / "items")
    keys = table.column("key").to_numpy()
    expected = np.unique(np.concatenate([_first_ids(b, "C2") for b in data]))
    assert sorted(keys.tolist()) == expected.tolist()  # each key once
    vectors = np.stack(table.column("item_vec").to_numpy(zero_copy_only=False))
    assert vectors.shape == (keys.size, 4)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    trainer.stop()
