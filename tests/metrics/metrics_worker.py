"""One worker of the distributed metrics test (run as a script by test_metrics_distributed).

Usage: python metrics_worker.py RANK WORLD PORT OUT_JSON

Every worker builds the same data set, keeps only its (uneven) share, all-reduces the
metrics with ``compute(global_=True)`` and writes the results as JSON. Bounded: the gloo
group and every collective have a timeout.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist

from sparseps.errors import DeadlineError, UnavailableError
from sparseps.metrics import CTRMetrics
from sparseps.testing import wait_until

N = 30_000
GROUPED_SPLITS = (0, 1_500, 11_000, N)  # uneven shares: 1.5k, 9.5k, 19k samples
PLAIN_SPLITS = (0, 4_000, N, N)  # rank 2 gets no samples at all
BATCH = 1_000
TIMEOUT_PROBE_S = 2.0


def make_data():
    """Deterministic predictions (with heavy ties and exact 0/1), labels and user ids."""
    rng = np.random.default_rng(7)
    pred = rng.random(N)
    pred[: N // 3] = np.round(pred[: N // 3], 2)  # heavy ties
    pred[::97], pred[1::89] = 0.0, 1.0  # predictions exactly 0 and 1
    label = (rng.random(N) < pred * 0.8 + 0.05).astype(np.float32)
    users = rng.integers(0, 400, N).astype(np.int64)
    return pred.astype(np.float32), label, users


def _feed(metrics, lo, hi, pred, label, users=None):
    for start in range(lo, hi, BATCH):
        stop = min(start + BATCH, hi)
        group = None if users is None else users[start:stop]
        metrics.update(pred[start:stop], label[start:stop], group)


def main(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    pred, label, users = make_data()
    grouped = CTRMetrics()
    _feed(grouped, GROUPED_SPLITS[rank], GROUPED_SPLITS[rank + 1], pred, label, users)
    plain = CTRMetrics(num_buckets=4096)
    _feed(plain, PLAIN_SPLITS[rank], PLAIN_SPLITS[rank + 1], pred, label)
    result = {
        "grouped": grouped.compute(global_=True, timeout=60).to_dict(),
        "plain": plain.compute(global_=True, timeout=60).to_dict(),
        "local_count": grouped.compute().count,
    }
    dist.barrier()
    # timeout probe: rank 2 stays alive but skips the collective; the others must give up
    if rank == world - 1:
        # alive but absent (not dead: the others must time out, not see a closed peer)
        # until every other rank has given up and written its results
        others = [Path(out).with_name(f"{r}.json") for r in range(world - 1)]
        wait_until(lambda: all(p.exists() for p in others), 60, "the other ranks' probes")
        result["probe"] = "skipped"
    else:
        start = time.monotonic()
        try:
            plain.compute(global_=True, timeout=TIMEOUT_PROBE_S)
            result["probe"] = "no error"
        except (DeadlineError, UnavailableError) as exc:
            result["probe"] = type(exc).__name__
            result["probe_setting"] = getattr(exc, "setting", None)
        result["probe_s"] = time.monotonic() - start
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    # the results are written and closed: skip the interpreter's teardown (torch's modules
    # and the gloo group, seconds of CPU on a loaded 2-core box while the test waits)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
