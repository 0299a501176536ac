"""The trainer in local mode (this process = worker 0 of 1, one background server).

- modules sharing one table over different slots, and pooling "mean" / None, equal a
  plain PyTorch reference (full table, same steps) in sync mode;
- conflicting declarations of one table are rejected when the trainer is built;
- DNN and DeepFM learn planted data through the trainer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparseps as sps
from sparseps.config import Initializer
from sparseps.errors import ConfigError
from sparseps.nn import SparseEmbedding
from sparseps.table.initializers import initial_values

DIM = 3
INIT = Initializer.uniform(-0.5, 0.5)
LR = 0.2


def _custom_pool(rows: torch.Tensor, offsets: torch.Tensor, bags: int) -> torch.Tensor:
    """What a user does with pooling=None: here a sum of squares per bag."""
    ends = torch.cat([offsets[1:], torch.tensor([rows.shape[0]])])
    bag_of_row = torch.repeat_interleave(torch.arange(bags), ends - offsets)
    return torch.zeros(bags, rows.shape[1]).index_add(0, bag_of_row, rows * rows)


class TwoViews(nn.Module):
    """Two modules on one table: ``a`` over C1, C2 (pooling under test), ``b`` over C2, C3."""

    def __init__(self, table: str, pooling_a):
        super().__init__()
        rule = sps.optim.SGD(lr=LR)
        self.a = SparseEmbedding(
            table, DIM, slots=("C1", "C2"), pooling=pooling_a, rule=rule, initializer=INIT
        )
        self.b = SparseEmbedding(table, DIM, slots=("C2", "C3"), rule=rule, initializer=INIT)
        torch.manual_seed(0)
        self.head = nn.Linear(4 * DIM + 2, 1)

    def forward(self, batch):
        size = len(batch)
        if self.a.pooling is None:
            rows, offsets = self.a(batch)
            a = _custom_pool(rows, torch.from_numpy(offsets.numpy()), 2 * size)
            a = a.view(2, size, DIM).transpose(0, 1)
        else:
            a = self.a(batch)
        b = self.b(batch)
        dense = torch.from_numpy(batch.dense)
        return self.head(torch.cat([a.flatten(1), b.flatten(1), dense], 1)).reshape(-1)


def _bags(batch, slots, keys):
    """(row index into the full table, bag offsets) the obvious way, for the reference."""
    index, offsets, base = [], [], 0
    for name in slots:
        slot = batch.slots[name]
        index.append(np.searchsorted(keys, slot.values))
        offsets.append(slot.offsets[:-1] + base)
        base += len(slot.values)
    return torch.from_numpy(np.concatenate(index)), torch.from_numpy(np.concatenate(offsets))


def _reference(batches, keys, pooling_a, head_state):
    table = nn.Parameter(torch.from_numpy(initial_values(keys, DIM, INIT, 0)))
    head = nn.Linear(4 * DIM + 2, 1)
    head.load_state_dict(head_state)
    opt = torch.optim.SGD([table, *head.parameters()], lr=LR)
    for batch in batches:
        size = len(batch)
        idx, off = _bags(batch, ("C1", "C2"), keys)
        if pooling_a is None:
            a = _custom_pool(table[idx], off, 2 * size).view(2, size, DIM).transpose(0, 1)
        else:
            a = F.embedding_bag(idx, table, off, mode=pooling_a).view(2, size, DIM).transpose(0, 1)
        idx, off = _bags(batch, ("C2", "C3"), keys)
        b = F.embedding_bag(idx, table, off, mode="sum").view(2, size, DIM).transpose(0, 1)
        x = torch.cat([a.flatten(1), b.flatten(1), torch.from_numpy(batch.dense)], 1)
        loss = F.binary_cross_entropy_with_logits(
            head(x).reshape(-1), torch.from_numpy(batch.label)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return table.detach().numpy(), head


@pytest.mark.parametrize("pooling_a", ["sum", "mean", None])
def test_modules_sharing_a_table_equal_a_plain_torch_reference(local_worker, planted, pooling_a):
    batches = planted(3, 6, 16, shared_ids=True, vocab=12)
    keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
    # a key read by both modules in one batch: their gradients must merge per key
    first = batches[0].slots
    assert np.intersect1d(first["C1"].values, first["C3"].values).size > 0
    table = f"shared_{pooling_a}"
    model = TwoViews(table, pooling_a)
    head_state = {k: v.clone() for k, v in model.head.state_dict().items()}
    trainer = sps.Trainer(model, sps.optim.SGD(lr=LR), sps.Strategy(mode="sync"))
    try:
        trainer.train_from_dataset(batches, print_period=0)
        got = trainer.client.pull(table, keys).wait()
        stats = trainer.client.stats()["total"]["tables"][table]
    finally:
        trainer.stop()
    want, head = _reference(batches, keys, pooling_a, head_state)
    # float32 sums in another order (per-key merge, then the SGD step): 1e-5 absolute
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for ours, theirs in zip(model.head.parameters(), head.parameters(), strict=True):
        np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), atol=1e-5)
    assert (
        np.abs(want - initial_values(keys, DIM, INIT, 0)).max() > 1e-3
    )  # rows moved (100x the tolerance)
    assert stats["rows"] == keys.size  # one table, every key of the union once


def test_one_table_declared_with_different_configs_is_rejected():
    model = nn.ModuleDict(
        {
            "a": SparseEmbedding("clash", 4, slots=("C1",)),
            "b": SparseEmbedding("clash", 8, slots=("C2",)),
        }
    )
    with pytest.raises(ConfigError, match=r"table 'clash' is declared twice.*dim=4.*dim=8"):
        sps.Trainer(model)


@pytest.mark.parametrize("model_name", ["DNN", "DeepFM"])
def test_builtin_models_learn_planted_data(local_worker, planted, model_name):
    slots = ("C1", "C2", "C3")
    train = planted(11, 40, 64, slots)
    test = planted(12, 10, 256, slots)
    cls = getattr(sps.models, model_name)
    torch.manual_seed(0)
    model = cls(slots, 2, emb_dim=4, hidden=(16,))
    trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode="async"))
    try:
        losses = [trainer.train_from_dataset(train, print_period=0).metrics.logloss]
        losses += [trainer.train_from_dataset(train, print_period=0).metrics.logloss]
        test_auc = trainer.evaluate(test).auc
    finally:
        trainer.stop()
    from sparseps.metrics import exact_auc

    bayes = exact_auc(*_bayes(test, slots))
    print(f"{model_name}: logloss {losses}, test AUC {test_auc:.4f} (planted {bayes:.4f})")
    assert losses[1] < losses[0] - 0.01
    # Async mode, one worker: the push thread and the prefetched pulls race, so the AUC is
    # a draw, but a narrow one. 8 runs on the 2-core machine (planted 0.9258): DNN 0.9164 ..
    # 0.9169, DeepFM 0.9152 .. 0.9157 (sd 0.0002 each). The bound, 90% of the planted
    # model's lift over 0.5 (0.8832), is 0.032 under the lowest run (over 100 sd) and
    # still fails a model that stopped learning half of what is there (0.6 before: 0.755).
    assert test_auc > 0.5 + 0.9 * (bayes - 0.5), (test_auc, bayes)


def _bayes(batches, slots):
    """The planted model's probabilities (the best AUC any model can reach)."""
    model = np.random.default_rng(1000)
    weights = model.normal(0.0, 1.5, (len(slots), 30))
    dense_w = model.normal(0.0, 1.0, 2)
    probs, labels = [], []
    for batch in batches:
        logit = batch.dense.astype(np.float64) @ dense_w
        for s, name in enumerate(slots):
            slot = batch.slots[name]
            ids = (slot.values - np.uint64((s + 1) * 1_000_000)).astype(np.int64)
            sample = np.repeat(np.arange(len(batch)), np.diff(slot.offsets))
            logit += np.bincount(sample, weights[s, ids], minlength=len(batch))
        probs.append(1 / (1 + np.exp(-logit)))
        labels.append(batch.label)
    return np.concatenate(probs), np.concatenate(labels)
