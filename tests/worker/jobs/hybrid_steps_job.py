"""One worker of test_hybrid_steps (run as a script): hybrid mode's steps, fake servers.

Usage: python hybrid_steps_job.py RANK PORT OUT_JSON. Two workers with uneven data (rank
0: 3 batches of 10 samples, rank 1: 2 of 11) step a HybridMode; each records the
collectives of every step, its dense values after each step and the pushes it sent.
"""

from __future__ import annotations

import datetime
import json
import sys

import numpy as np
import torch.distributed as dist
from torch import nn

import sparseps as sps
from sparseps.config import TableConfig
from sparseps.core import collectives
from sparseps.worker.dense_params import DenseParams
from sparseps.worker.hybrid_mode import HybridMode

BATCHES = (3, 2)  # per rank
SIZES = (10, 11)  # samples per batch, per rank


class _Done:
    def wait(self, timeout=None):
        return None


class PushLog:
    """Stands in for the servers: records what this worker pushes."""

    timeout = 30.0

    def __init__(self):
        self.pushed: list[tuple[str, list[int], float]] = []

    def push(self, table, keys, grads, shows=None, clicks=None):
        self.pushed.append((table, sorted(int(k) for k in keys), float(grads.sum())))
        return _Done()


def main(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))  # fmt: skip
    servers = PushLog()
    module = nn.Linear(2, 1)
    if rank == 1:  # different initial values: the mode starts from rank 0's
        nn.init.constant_(module.weight, 5.0)
    mode = HybridMode(servers, DenseParams(module), sps.optim.SGD(lr=0.1),
                      sps.Strategy(mode="hybrid"), rank, tables=[TableConfig(name="a", dim=2)])  # fmt: skip
    items = [([0] * SIZES[rank], None, None) for _ in range(BATCHES[rank])]
    per_step, dense, before = [], [mode.dense.values().tolist()], collectives.counts()
    for step, item in enumerate(mode.steps(items)):
        keys = (
            np.array([step, 100 + rank], np.uint64) if item is not None else np.zeros(0, np.uint64)
        )
        grads = [("a", keys, np.full((keys.size, 2), rank + 1.0, np.float32),
                  np.ones(keys.size, np.float32), np.zeros(keys.size, np.float32))]  # fmt: skip
        # the dense gradient of this worker's loss over the global batch (sync's scale)
        dense_grad = np.full(mode.dense.size, rank + 1.0, np.float32) if item is not None else \
            np.zeros(mode.dense.size, np.float32)  # fmt: skip
        mode.apply(grads, dense_grad)
        now = collectives.counts()
        per_step.append(
            {op: n - before.get(op, 0) for op, n in now.items() if n != before.get(op, 0)}
        )
        before = now
        dense.append(mode.dense.values().tolist())
    mode.finish_pass()
    mode.close()
    with open(out, "w") as f:
        json.dump({"per_step": per_step, "dense": dense, "pushed": servers.pushed}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
