"""One worker of test_metrics_fleet (run as a script): fleet-style metrics over 2 workers.

Usage: python fleet_worker.py RANK WORLD PORT OUT_JSON. Each worker takes an uneven share
of one data set, computes the global CTRMetrics (accuracy at 0.3, MSE, RMSE, MAE), user
statistics (sum / max / min, numbers and tensors, one name declared by rank 0 only) and
``sps.all_reduce`` of a number, an array and a tensor, and writes them as JSON.
"""

from __future__ import annotations

import datetime
import json
import sys

import numpy as np
import torch
import torch.distributed as dist

import sparseps as sps
from sparseps.metrics import CTRMetrics, UserStats

N = 5_000
SPLITS = (0, 1_234, N)


def make_data():
    rng = np.random.default_rng(11)
    pred = rng.random(N)
    label = (rng.random(N) < pred).astype(np.float32)
    return pred, label


def main(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))  # fmt: skip
    pred, label = make_data()
    lo, hi = SPLITS[rank], SPLITS[rank + 1]
    metrics, stats = CTRMetrics(num_buckets=1024, threshold=0.3), UserStats()
    for start in range(lo, hi, 500):
        p, y = pred[start : min(start + 500, hi)], label[start : min(start + 500, hi)]
        metrics.update(p, y)
        stats.add("clicks", y.sum())
        stats.add("max_pred", torch.from_numpy(p).max(), op="max")
        stats.add("min_pred", p.min(), op="min")
        stats.add("per_class", np.array([(y == 0).sum(), (y == 1).sum()]))
        if rank == 0:
            stats.add("rank0_only", 1.0)
    result = metrics.compute(global_=True, timeout=60)
    user = stats.compute(global_=True, timeout=60)
    reduced = {
        "number": sps.all_reduce(float(rank + 1)),
        "array_max": sps.all_reduce(np.array([rank, -rank]), "max").tolist(),
        "tensor_min": sps.all_reduce(torch.tensor([rank + 0.5]), "min").tolist(),
    }
    user = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in user.items()}
    with open(out, "w") as f:
        json.dump({"metrics": result.to_dict(), "stats": user, "reduced": reduced}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
