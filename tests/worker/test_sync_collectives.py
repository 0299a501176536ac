"""Sync mode's collectives per step, counted in two real worker processes on loopback.

A step is three collectives: the header all-gather (who has data, the global batch, every
worker's gradient buffer size), one all-gather of every table's packed sparse gradients
and the dense all-reduce (the first version took 19 with two tables: a 2-number
all-reduce, 8 gathers per table, the dense all-reduce and a barrier). A pass ends with one
more header, in which nobody has data. The pushes of each step are still every worker's
keys, each pushed once by the worker its hash routes it to.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from sparseps.core.routing import server_of
from sparseps.rpc.transport import free_port
from sparseps.testing import run_ranks

JOB = Path(__file__).parent / "jobs" / "sync_steps_job.py"


def _job():
    spec = importlib.util.spec_from_file_location("sync_steps_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_sync_step_is_three_collectives_and_pushes_every_workers_keys(tmp_path):
    port = free_port()
    run_ranks(JOB, 2, lambda r: [r, port, tmp_path / f"{r}.json"], timeout_s=180)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    job = _job()
    steps = max(job.BATCHES)
    for rank in range(2):
        assert got[rank]["per_step"] == [{"all_gather": 2, "all_reduce": 1}] * steps
        assert got[rank]["after_last_step"] == {"all_gather": 1}  # the empty header
        # every step scaled by the global batch (rank 0: 10 samples, rank 1: 11 per batch)
        assert got[rank]["global_batch"] == [21, 21, 10]
    assert got[0]["dense"] == got[1]["dense"]
    data = [[grads for _, grads in job.items(rank)] for rank in range(2)]
    for step in range(steps):
        for t, (table, _) in enumerate(job.TABLES):
            parts = [data[r][step][t] for r in range(2) if step < len(data[r])]
            keys = np.concatenate([p[1] for p in parts])
            pushes = [got[r]["pushed"][step * len(job.TABLES) + t] for r in range(2)]
            for rank, (name, pushed, grad_sum, shows) in enumerate(pushes):
                mine = keys[server_of(keys, 2) == rank]
                assert name == table and pushed == sorted(mine.tolist())
                want = sum(p[2][server_of(p[1], 2) == rank].sum() for p in parts)
                assert grad_sum == want and shows == mine.size
