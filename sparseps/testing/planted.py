"""Batches from a planted logistic model: training data whose answer is known.

Tests of training (the worker tests, the elastic jobs launched by tests) need batches a
model can learn and that any process rebuilds from a seed alone: each (slot, id) has a
weight drawn once from a fixed generator, a sample's logit is the sum of its ids'
weights (plus, by default, a dense term), and its label is Bernoulli(sigmoid(logit)).
One builder, so that every test trains on the same kind of data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..data.schema import Batch, Slot

__all__ = ["planted_batches"]

# the generator of the planted weights: the same model for every seed, so batches of
# different seeds (workers, passes, train and test) come from one distribution
_MODEL_SEED = 1000


def planted_batches(
    seed: int,
    batches: int,
    batch_size: int,
    slots: Sequence[str] = ("C1", "C2", "C3"),
    *,
    vocab: int = 30,
    num_dense: int = 2,
    scale: float = 1.5,
    shared_ids: bool = False,
    dense_term: bool = True,
) -> list[Batch]:
    """``batches`` batches of ``batch_size`` samples drawn with ``seed``.

    Each sample has 0 to 2 ids per slot, drawn from ``vocab`` ids; the weights of the
    (slot, id) pairs are normal with sd ``scale``. Sample ids run on across the batches
    (``b * batch_size ...``).

    Args:
        shared_ids: every slot draws ids from the same range, so one key occurs in
            several slots (what a table shared by modules over different slots must
            merge). Ids of different slots are otherwise disjoint (slot ``s`` adds
            ``(s + 1) * 1_000_000``).
        dense_term: the ``num_dense`` dense features enter the logit with planted weights
            (sd 1); when False they are noise the labels do not depend on. The random
            draws of the batches are the same either way.
    """
    rng = np.random.default_rng(seed)
    model = np.random.default_rng(_MODEL_SEED)
    weights = model.normal(0.0, scale, (len(slots), vocab))
    dense_w = model.normal(0.0, 1.0, num_dense)  # after ``weights``: those keep one value
    out = []
    for b in range(batches):
        logit = np.zeros(batch_size)
        columns = {}
        for s, name in enumerate(slots):
            lengths = rng.integers(0, 3, batch_size)
            offsets = np.zeros(batch_size + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            ids = rng.integers(0, vocab, int(offsets[-1]))
            sample = np.repeat(np.arange(batch_size), lengths)
            logit += np.bincount(sample, weights[s, ids], minlength=batch_size)
            base = 0 if shared_ids else (s + 1) * 1_000_000
            columns[name] = Slot((ids + base).astype(np.uint64), offsets)
        dense = rng.normal(0.0, 1.0, (batch_size, num_dense)).astype(np.float32)
        if dense_term:
            logit += dense @ dense_w
        label = (rng.random(batch_size) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        sample_ids = np.arange(b * batch_size, (b + 1) * batch_size, dtype=np.int64)
        out.append(Batch(label, dense, columns, sample_ids))
    return out
