"""Issue 27: a Paddle-style generator script (sparseps.data.MultiSlotStringDataGenerator)
as a pipe_command trains a pass on every input line and gives the same test AUC as the
same rows read as Criteo TSV (sync mode, same seeds)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.data.synthetic import write_dataset

pytestmark = pytest.mark.timeout(120)

GENERATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "criteo_string_generator.py")  # fmt: skip


def _train_and_test(train, test):
    """One pass then a test evaluation, in a fresh local job (server and worker)."""
    env = sps.init()
    assert env.local
    try:
        torch.manual_seed(0)
        model = sps.models.DNN(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(16,))
        trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode="sync"))
        try:
            result = trainer.train_from_dataset(train, print_period=0)
            metrics = trainer.evaluate(test)
        finally:
            trainer.stop()
    finally:
        sps.stop()
    return result.metrics, metrics


def test_generator_pipe_command_trains_every_line_and_matches_the_tsv_auc(tmp_path):
    meta = write_dataset(tmp_path, 3000, seed=5, files=2, test_rows=1000)
    train = sorted(str(p) for p in (tmp_path / "train").iterdir())
    test = str(tmp_path / "test")
    lines = sum(sum(1 for _ in open(p)) for p in train)  # noqa: SIM115
    assert lines == meta["rows"] == 3000
    command = f"{sys.executable} {GENERATOR}"

    def generated(files):
        return QueueDataset(files, CRITEO, 256, pipe_command=command, format="multislot_string")

    gen_train, gen_test = _train_and_test(generated(train), generated(test))
    tsv_train, tsv_test = _train_and_test(
        QueueDataset(train, CRITEO, 256), QueueDataset(test, CRITEO, 256)
    )
    assert gen_train.count == tsv_train.count == lines  # every line trained
    assert gen_test.count == tsv_test.count == 1000
    print(f"test auc generator {gen_test.auc:.6f} tsv {tsv_test.auc:.6f}")
    assert abs(gen_test.auc - tsv_test.auc) <= 1e-6
    assert abs(gen_train.logloss - tsv_train.logloss) <= 1e-6
    assert gen_test.auc > 0.55  # it learned something (the planted model is ~0.8)
