"""A training mode written outside the package runs through Trainer unchanged.

``LocalDenseMode`` is a toy: sparse gradients are pushed and waited for every step (no
queue), the dense parameters never leave the worker (a local ``DenseTable`` applies the
dense rule, like sync mode on one worker). It implements ``TrainingMode``, and a config
of its own (a ``sparseps.Mode``) builds it; the trainer only talks to the interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

import sparseps as sps
from sparseps.errors import ConfigError
from sparseps.table import DenseTable
from sparseps.worker.modes import TrainingMode


class LocalDenseMode(TrainingMode):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.local_dense = DenseTable(
            "toy-dense", self.dense.size, rule=self.dense_rule, init=self.dense.values()
        )
        self.pushes = 0

    def apply(self, grads: list, dense_grad: np.ndarray) -> None:
        handles = [
            self.client.push(table, keys, grad, shows=shows, clicks=clicks)
            for table, keys, grad, shows, clicks in grads
        ]
        for handle in handles:
            handle.wait()
        self.pushes += len(handles)
        self.local_dense.push(np.ascontiguousarray(dense_grad, np.float32))
        self.dense.set(self.local_dense.pull())
        self.step += 1

    def save_dense(self, directory) -> str:  # not used here: nothing to save on servers
        raise NotImplementedError


@dataclass(frozen=True)
class LocalDense(sps.Mode):
    name: ClassVar[str] = "local-dense"

    def build(self, client, dense, dense_rule, strategy, rank, *, tables):
        return LocalDenseMode(client, dense, dense_rule, strategy, rank, tables=tables)


def test_strategy_lists_the_modes_for_an_unknown_name():
    with pytest.raises(
        ConfigError,
        match=r"Strategy.mode: expected a sparseps.Mode or one of \(.*'geo'.*\), got 'toy'",
    ):
        sps.Strategy(mode="toy")
    with pytest.raises(ConfigError, match="Strategy.mode: expected a sparseps.Mode"):
        sps.Strategy(mode=3)


def test_a_mode_defined_in_a_test_trains_through_the_trainer(local_worker, planted):
    slots = ("C1", "C2", "C3")
    train, test = planted(11, 30, 64, slots), planted(12, 5, 256, slots)
    model = sps.models.DNN(slots, 2, emb_dim=4, hidden=(8,))
    trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode=LocalDense()))
    try:
        first = trainer.train_from_dataset(train, print_period=0).metrics.logloss
        second = trainer.train_from_dataset(train, print_period=0).metrics.logloss
        auc = trainer.evaluate(test).auc
        mode = trainer.state.mode
        assert isinstance(mode, LocalDenseMode) and mode.step == 60
        assert mode.pushes == 60 * len(trainer.tables)
        rows = trainer.client.stats()["servers"][0]["tables"]
    finally:
        trainer.stop()
    assert second < first  # it learns: the servers applied the pushes, the head moved
    assert auc > 0.6, auc
    assert rows  # tables were created on the servers by the trainer, not the mode
