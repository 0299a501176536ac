"""Built-in models: forward/backward through bound rows, and heads that export to TorchScript."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sparseps.checkpoint.inference import export_head
from sparseps.core.lookup import build_lookup
from sparseps.errors import InputError
from sparseps.models import DNN, DeepFM, WideDeep

SLOTS = ("a", "b", "c")


class _Batch(SimpleNamespace):
    def __len__(self):
        return len(self.label)


def _batch(rng, n=5):
    slots = {}
    for name in SLOTS:
        lengths = rng.integers(0, 3, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        slots[name] = SimpleNamespace(
            values=rng.integers(0, 20, offsets[-1]).astype(np.uint64), offsets=offsets
        )
    return _Batch(
        label=rng.integers(0, 2, n).astype(np.float32),
        dense=rng.random((n, 4), dtype=np.float32),
        slots=slots,
    )


@pytest.mark.parametrize("cls", [WideDeep, DNN, DeepFM])
def test_model_trains_through_bound_rows_and_its_head_scripts(cls):
    rng = np.random.default_rng(0)
    model = cls(SLOTS, 4, emb_dim=3, hidden=(8,))
    batch = _batch(rng)
    lookup = build_lookup(batch, SLOTS)
    leaves = {}
    for emb in model.embeddings:
        rows = torch.from_numpy(rng.standard_normal((lookup.keys.size, emb.dim)).astype(np.float32))
        leaves[emb.table] = rows
        emb.bind(lookup, rows, grad=True)
    logits = model(batch)
    assert logits.shape == (5,)
    torch.nn.functional.binary_cross_entropy_with_logits(
        logits, torch.from_numpy(batch.label)
    ).backward()
    for emb in model.embeddings:
        grad = leaves[emb.table].grad
        assert grad is not None and grad.shape == (lookup.keys.size, emb.dim)
        # a key that occurs in the batch gets a gradient; the pooling is linear in the rows
        assert torch.count_nonzero(grad.abs().sum(1)) > 0
    exported = export_head(model).module()  # what an inference save holds
    pooled = [emb(batch) for emb in model.embeddings]
    dense = torch.from_numpy(batch.dense)
    assert torch.allclose(exported(dense, *pooled).reshape(-1), logits, atol=1e-6)


def test_unbound_embedding_says_how_to_run_it():
    model = DNN(SLOTS, 4, emb_dim=2, hidden=(4,))
    with pytest.raises(InputError, match="Trainer or sparseps.Predictor"):
        model(_batch(np.random.default_rng(1)))
