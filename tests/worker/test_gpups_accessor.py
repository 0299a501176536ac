"""GPUPS with a split (CTR-accessor) table, device="cpu", in local mode (issue 54).

- with ``embedx_threshold=0`` (every row's embedx part from its first push) two GPUPS
  passes equal two sync passes: the device steps each part with its own rule, as the
  server does, and the write-back carries rows of both parts;
- with a threshold, the write-back stores an embedx part only for rows whose score
  reached it: the others stay small on the servers.
"""

from __future__ import annotations

import numpy as np
import torch

import sparseps as sps
from sparseps.models import WideDeep

SLOTS = ("C1", "C2", "C3")


def _train(prefix: str, strategy, batches, threshold: float):
    torch.manual_seed(0)
    model = WideDeep(SLOTS, 2, emb_dim=4, hidden=(8,), deep_table=f"{prefix}_deep",
                     deep_rule=sps.optim.SparseAdagrad(lr=0.05), embedx_threshold=threshold,
                     wide_rule=sps.optim.SGD(lr=0.05))  # fmt: skip
    trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), strategy)
    for _ in range(2):
        trainer.train_from_dataset(batches, print_period=0)
    return trainer


def test_gpups_split_table_equals_sync_and_keeps_rows_small(local_worker, planted):
    batches = planted(5, 8, 32, slots=SLOTS, vocab=40)
    keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
    gpups_mode = sps.Strategy(mode=sps.GpuPS(device="cpu"))
    sync = _train("as", sps.Strategy(mode="sync"), batches, 0.0)
    gpups = _train("ag", gpups_mode, batches, 0.0)
    try:
        want = sync.client.pull("as_deep", keys).wait()
        got = gpups.client.pull("ag_deep", keys).wait()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.abs(want[:, 1:]).max() > 1e-2 and np.abs(want[:, 0]).max() > 1e-3
    finally:
        sync.stop()
        gpups.stop()
    small = _train("at", gpups_mode, batches, 1000.0)  # no row reaches it
    try:
        stats = small.client.stats()["servers"][0]["tables"]["at_deep"]
        assert stats["rows"] == keys.size and stats["embedx_rows"] == 0
        rows = small.client.pull("at_deep", keys).wait()
        assert not rows[:, 1:].any() and rows[:, 0].any()  # embed_w trained, no embedx
    finally:
        small.stop()
