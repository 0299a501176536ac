"""One worker of test_sync_collectives (run as a script): sync mode's steps on fake servers.

Usage: python sync_steps_job.py RANK PORT OUT_JSON. Two workers with uneven data (rank 0:
3 batches, rank 1: 2) step a SyncMode over two tables; each records the collectives every
step issued, the global batch it scaled by, and the keys and gradient sums it pushed.
"""

from __future__ import annotations

import datetime
import json
import sys
from types import SimpleNamespace

import numpy as np
import torch.distributed as dist
from torch import nn

import sparseps as sps
from sparseps.config import TableConfig
from sparseps.core import collectives
from sparseps.worker.dense_params import DenseParams
from sparseps.worker.modes import SyncMode

TABLES = (("a", 2), ("b", 3))
BATCHES = (3, 2)  # per rank


class _Done:
    def wait(self, timeout=None):
        return None


class PushLog:
    """Stands in for the servers: records what this worker pushes."""

    def __init__(self):
        self.pushed: list[tuple[str, list[int], float, float]] = []

    def push(self, table, keys, grads, shows=None, clicks=None):
        self.pushed.append((table, sorted(int(k) for k in keys), float(grads.sum()),
                            float(shows.sum())))  # fmt: skip
        return _Done()


def items(rank: int):
    """``(batch, lookups, rows)`` as the trainer's prefetcher gives them; ``grads`` too."""
    rng = np.random.default_rng(rank)
    for b in range(BATCHES[rank]):
        keys = {
            t: np.unique(rng.integers(0, 50, 5 + b + rank).astype(np.uint64)) for t, _ in TABLES
        }
        lookups = {t: SimpleNamespace(keys=k) for t, k in keys.items()}
        grads = [(t, keys[t], np.full((keys[t].size, dim), rank + 1.0, np.float32),
                  np.ones(keys[t].size, np.float32), np.zeros(keys[t].size, np.float32))
                 for t, dim in TABLES]  # fmt: skip
        yield (list(range(10 + rank)), lookups, None), grads


def _diff(before: dict, now: dict) -> dict:
    return {op: n - before.get(op, 0) for op, n in now.items() if n != before.get(op, 0)}


def main(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))  # fmt: skip
    tables = [TableConfig(name=t, dim=d, rule=sps.optim.SGD(lr=0.1)) for t, d in TABLES]
    servers = PushLog()
    module = nn.Linear(2, 1)
    mode = SyncMode(servers, DenseParams(module), sps.optim.SGD(lr=0.1),
                    sps.Strategy(mode="sync"), rank, tables=tables)  # fmt: skip
    data = list(items(rank))
    per_step, batches, step = [], [], 0
    before = collectives.counts()
    for item in mode.steps([i for i, _ in data]):
        grads = data[step][1] if item is not None else [
            (t, np.empty(0, np.uint64), np.zeros((0, d), np.float32), np.zeros(0, np.float32),
             np.zeros(0, np.float32)) for t, d in TABLES]  # fmt: skip
        batches.append(mode.global_batch)
        mode.apply(grads, np.ones(mode.dense.size, np.float32))
        now = collectives.counts()
        per_step.append(_diff(before, now))
        before, step = now, step + 1
    after_end = collectives.counts()
    last = _diff(before, after_end)
    with open(out, "w") as f:
        json.dump({"per_step": per_step, "after_last_step": last, "global_batch": batches,
                   "pushed": servers.pushed, "dense": mode.dense.values().tolist()}, f)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
