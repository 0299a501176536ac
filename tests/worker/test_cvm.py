"""CVM and the CTR accessor through the trainer (issue 54), in local mode.

- ``SparseEmbedding(..., cvm=True)`` gives the model Paddle's cvm features of each slot's
  pooled counts, pulled with the embedding: checked against numpy on the counts the
  servers hold; the counts are Paddle's push (one show per instance, one click per
  instance with label 1) and no gradient reaches them;
- a split DNN with cvm learns planted data, and its inference model predicts what the
  trainer's model predicts (the predictor reads the counts and the split rows).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import sparseps as sps
from sparseps.checkpoint.predictor import Predictor
from sparseps.config import Accessor
from sparseps.nn import SparseEmbedding
from sparseps.worker.predict import read_predictions

SLOTS = ("C1", "C2")


class _CvmModel(nn.Module):
    def __init__(self, table: str):
        super().__init__()
        accessor = Accessor(embed_dim=1, embedx_threshold=0.5)
        self.emb = SparseEmbedding(table, 4, slots=SLOTS, rule=sps.optim.SparseAdagrad(),
                                   cvm=True, accessor=accessor)  # fmt: skip
        torch.manual_seed(0)
        self.head = nn.Linear(2 * 6 + 2, 1)
        self.seen = []

    def forward(self, batch):
        out = self.emb(batch)
        self.seen.append(out.detach().clone())
        return self.head(torch.cat([out.flatten(1), torch.from_numpy(batch.dense)], 1)).reshape(-1)


def test_cvm_features_are_the_pooled_counts(local_worker, planted):
    batches = planted(3, 5, 32, SLOTS, shared_ids=True, vocab=20)
    model = _CvmModel("cvm_counts")
    trainer = sps.Trainer(model, sps.optim.SGD(lr=0.1), sps.Strategy(mode="sync"))
    try:
        trainer.train_from_dataset(batches[:4], print_period=0)
        keys = np.unique(np.concatenate([b.slots[s].values for b in batches for s in SLOTS]))
        counts = trainer.client.pull("cvm_counts", keys).wait()[:, :2]
        model.seen.clear()
        trainer.evaluate([batches[4]])  # a forward on the counts as they are now
    finally:
        trainer.stop()
    # Paddle's push: every instance one show, a click when its label is 1
    occurrences = {int(k): [0.0, 0.0] for k in keys}
    for batch in batches[:4]:
        for s in SLOTS:
            slot = batch.slots[s]
            sample = np.repeat(np.arange(len(batch)), np.diff(slot.offsets))
            for key, label in zip(slot.values.tolist(), batch.label[sample].tolist(), strict=True):
                occurrences[key][0] += 1
                occurrences[key][1] += label
    np.testing.assert_array_equal(counts, np.array([occurrences[int(k)] for k in keys]))
    # the model's first two columns per slot: log(show+1), log(click+1) - log(show+1) of
    # the bag's summed counts
    batch, got = batches[4], model.seen[-1].numpy()
    by_key = {int(k): c for k, c in zip(keys, counts, strict=True)}
    for s, name in enumerate(SLOTS):
        slot = batch.slots[name]
        for i in range(len(batch)):
            ids = slot.values[slot.offsets[i] : slot.offsets[i + 1]].tolist()
            show, click = np.sum([by_key[k] for k in ids], axis=0) if ids else (0.0, 0.0)
            want = [np.log1p(show), np.log1p(click) - np.log1p(show)]
            np.testing.assert_allclose(got[i, s, :2], want, rtol=1e-6, atol=1e-6)


def test_split_dnn_with_cvm_learns_and_its_inference_model_agrees(local_worker, planted,
                                                                 tmp_path):  # fmt: skip
    slots = ("C1", "C2", "C3")
    train, test = planted(11, 30, 64, slots), planted(12, 4, 256, slots)
    torch.manual_seed(0)
    model = sps.models.DNN(slots, 2, emb_dim=4, hidden=(16,), cvm=True, embedx_threshold=35.0,
                           table="cvm_dnn")  # fmt: skip
    trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode="sync"))
    try:
        trainer.train_from_dataset(train, print_period=0)
        stats = trainer.client.stats()["servers"][0]["tables"]["cvm_dnn"]
        auc = trainer.evaluate(test).auc
        trainer.predict_from_dataset(test, tmp_path / "pred")
        trainer.save_inference_model(str(tmp_path / "model"))
    finally:
        trainer.stop()
    assert 0 < stats["embedx_rows"] < stats["rows"]  # the threshold kept some rows small
    assert auc > 0.8, auc
    ours = read_predictions(tmp_path / "pred").column("pred").to_numpy()
    served = Predictor(str(tmp_path / "model")).predict(test)
    np.testing.assert_allclose(served, ours, atol=1e-5)
