"""The GPUPS pipeline over a sequence of passes (``train_from_dataset(next_dataset=...)``).

While pass N trains, pass N+1's keys are read and the rows of those not in pass N pulled;
pass N's write-back is left in flight when it ends and lands during pass N+1's first
step. Four passes (the third over the device budget, so split) give bit for bit the
rows and dense parameters of the same passes trained one by one with nothing prepared,
and a prepared pass's build pulls nothing (a split pass builds its sub-passes from the
servers: what was prepared for it is not used).
"""

from __future__ import annotations

import numpy as np
import torch

import sparseps as sps
from sparseps.models import WideDeep
from sparseps.worker.gpups_table import bytes_per_key

SLOTS = ("C1", "C2", "C3")


def _keys(batches) -> np.ndarray:
    return np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))


def test_a_sequence_of_prepared_passes_equals_the_passes_one_by_one(local_worker, planted):
    vocabs = (40, 60, 160, 40)  # the third pass is over the budget
    days = [planted(20 + i, 6, 32, slots=SLOTS, vocab=v) for i, v in enumerate(vocabs)]
    runs = {}
    for prefix, pipelined in (("a", False), ("b", True)):
        torch.manual_seed(0)
        model = WideDeep(SLOTS, 2, emb_dim=4, hidden=(8,), deep_table=f"{prefix}_deep",
                         wide_table=f"{prefix}_wide")  # fmt: skip
        need = sum(_keys(days[2]).size * bytes_per_key(e.config) for e in model.embeddings)
        budget = need * 3 // 4
        strategy = sps.Strategy(mode=sps.GpuPS(device="cpu", memory_bytes=budget))
        trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), strategy)
        mode_state = []
        try:
            results = []
            for i, day in enumerate(days):
                following = days[i + 1] if pipelined and i + 1 < len(days) else None
                results.append(
                    trainer.train_from_dataset(day, print_period=0, next_dataset=following)
                )
                mode = trainer.state.mode
                mode_state.append((mode._pending is not None, dict(mode.last_build)))
            keys = _keys(sum(days, []))
            rows = {t[2:]: trainer.client.pull_full(t, keys).wait() for t in trainer.tables}
            dense = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
            runs[pipelined] = (rows, dense, results, mode_state)
        finally:
            trainer.stop()
    plain, piped = runs[False], runs[True]
    for table in ("deep", "wide"):
        np.testing.assert_array_equal(piped[0][table], plain[0][table])
    np.testing.assert_array_equal(piped[1], plain[1])
    assert [r.timings["sub_passes"] for r in piped[2]] == [0, 0, 2, 0]  # the third split
    # the write-back of the passes followed by a prepared one was in flight at their end
    assert [s[0] for s in piped[3]] == [True, True, True, False]
    assert [s[0] for s in plain[3]] == [False, False, False, False]
    second = piped[3][1][1]  # the second pass's build: carried or pulled early, nothing now
    assert second["pulled"] == 0 and second["carried"] > 0 and second["early"] > 0
    assert plain[3][1][1]["pulled"] > 0
