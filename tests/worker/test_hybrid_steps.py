"""Hybrid mode's step loop in two real worker processes on loopback (fake servers).

With uneven data (3 batches against 2) both workers take 4 steps: 3 with data on rank 0,
then one in which nobody has data; each step is one all-reduce; the dense update is the
global batch's gradient, the same on both workers from rank 0's initial values; every
sparse gradient reaches the (fake) servers.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from sparseps.rpc.transport import free_port
from sparseps.testing import run_ranks

JOB = Path(__file__).parent / "jobs" / "hybrid_steps_job.py"


def _job():
    spec = importlib.util.spec_from_file_location("hybrid_steps_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hybrid_steps_keep_uneven_workers_in_lock_step_with_identical_dense(tmp_path):
    port = free_port()
    run_ranks(JOB, 2, lambda r: [r, port, tmp_path / f"{r}.json"], timeout_s=180)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    job = _job()
    steps = max(job.BATCHES) + 1  # the last: nobody has data
    for rank in range(2):
        assert got[rank]["per_step"] == [{"all_reduce": 1}] * steps, got[rank]["per_step"]
    assert got[0]["dense"] == got[1]["dense"]  # bit-identical, step by step
    # the dense rule (SGD 0.1) applied the global batch's gradient: the workers' gradients
    # (of their loss over the global batch: rank r sends r + 1) weighted by batch size
    dense = np.array(got[0]["dense"])
    for step in range(steps):
        active = [r for r in range(2) if step < job.BATCHES[r]]
        total = sum(job.SIZES[r] for r in active)
        want = sum((r + 1.0) * 2 * job.SIZES[r] for r in active) / total if total else 0.0
        np.testing.assert_allclose(dense[step] - dense[step + 1], 0.1 * want, rtol=1e-5)
    # every sparse gradient reached the servers, pushes of 2 steps merged into one
    for rank in range(2):
        pushed = got[rank]["pushed"]
        keys = sorted(k for _, ks, _ in pushed for k in ks)
        want_keys = sorted([s for s in range(job.BATCHES[rank])] + [100 + rank] * job.BATCHES[rank])
        assert sorted(set(keys)) == sorted(set(want_keys))
        grad_sum = sum(g for _, _, g in pushed)
        assert grad_sum == (rank + 1.0) * 2 * 2 * job.BATCHES[rank]  # 2 keys x dim 2
        # 2 steps a push, or fewer when a step came after the merge deadline (timing)
        assert 1 <= len(pushed) <= job.BATCHES[rank], pushed
