"""Shared helpers of the worker tests: planted batches and an in-process local-mode worker."""

from __future__ import annotations

import numpy as np
import pytest

from sparseps.data.schema import Batch, Slot


def planted_batches(
    seed: int,
    batches: int,
    batch_size: int,
    slots=("C1", "C2", "C3"),
    *,
    vocab: int = 30,
    num_dense: int = 2,
    scale: float = 1.5,
    shared_ids: bool = False,
) -> list[Batch]:
    """Batches from a planted logistic model: each (slot, id) has a weight, a sample's
    logit is the sum of its ids' weights plus a dense term, its label Bernoulli(sigmoid).

    ``shared_ids``: every slot draws ids from the same range, so one key occurs in
    several slots (what a table shared by modules over different slots must merge).
    Ids of different slots are otherwise disjoint.
    """
    rng = np.random.default_rng(seed)
    model = np.random.default_rng(1000)  # the same planted weights for every seed
    weights = model.normal(0.0, scale, (len(slots), vocab))
    dense_w = model.normal(0.0, 1.0, num_dense)
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
        logit += dense @ dense_w
        label = (rng.random(batch_size) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        ids = np.arange(b * batch_size, (b + 1) * batch_size, dtype=np.int64)
        out.append(Batch(label, dense, columns, ids))
    return out


@pytest.fixture
def local_worker():
    """This test process as worker 0 of 1 in local mode, with a fresh background server
    (a server holds one dense table per job, so each test gets its own)."""
    import sparseps as sps

    env = sps.init()
    assert env.local and env.worker_num == 1
    yield env
    sps.stop()


@pytest.fixture
def planted():
    """:func:`planted_batches` (a fixture, so test modules need not import conftest)."""
    return planted_batches
