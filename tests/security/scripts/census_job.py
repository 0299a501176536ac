"""The job of tests/security/test_socket_census.py: ``census_job.py DIR TRAIN TEST``.

Every role runs it (fleetrun semantics). Servers serve. Workers train wide&deep in sync
mode (dense gradients all-reduced every step, metrics all-reduced at the end) around two
pauses, at which the test lists and probes every listening socket of the job:

1. after ``sps.init()`` and a round of exact collectives (the group is formed and has
   carried data): write ``DIR/ready.1.RANK``, wait for ``DIR/go.1``;
2. after training and evaluation: ``DIR/ready.2.RANK``, wait for ``DIR/go.2``; then the
   exact collectives again (the probes broke nothing), and ``DIR/worker.RANK.json``.

The exit code is 0 only if every collective gave the expected values.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import sparseps as sps
from sparseps.core import collectives
from sparseps.data import CRITEO, QueueDataset
from sparseps.models import WideDeep

PAUSE_S = 300.0  # the test probes within seconds; this only bounds a lost test


def exact_collectives(rank: int, world: int) -> bool:
    """Collectives with known answers: sums, a gather of uneven rows, an all-to-all."""
    total = collectives.all_reduce_sum(np.full(300_000, rank + 1, np.int64), timeout=60)
    rows = collectives.all_gather_arrays(np.full((rank + 1, 2), rank, np.uint64), timeout=60)
    sent = np.repeat(np.arange(world, dtype=np.int64), np.arange(1, world + 1)) + 100 * rank
    got, counts = collectives.all_to_all_rows(sent, np.arange(1, world + 1), timeout=60)
    collectives.barrier(timeout=60)
    return bool(
        (total == world * (world + 1) // 2).all()
        and all(np.array_equal(r, np.full((q + 1, 2), q, np.uint64)) for q, r in enumerate(rows))
        and counts.tolist() == [rank + 1] * world
        and got.tolist() == [rank + 100 * q for q in range(world) for _ in range(rank + 1)]
    )


def pause(folder: Path, phase: int, rank: int) -> None:
    (folder / f"ready.{phase}.{rank}").write_text("1")
    go = folder / f"go.{phase}"
    deadline = time.monotonic() + PAUSE_S
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"census_job: {go} did not appear within {PAUSE_S:.0f} s")
        time.sleep(0.05)


def main() -> int:
    folder, train_path, test_path = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    rank, world = sps.worker_index(), sps.worker_num()
    checks = [exact_collectives(rank, world)]
    with sps.PSClient(sps.server_endpoints(), timeout=60) as client:
        client.ping()  # every server listens before the first census
    pause(folder, 1, rank)
    torch.manual_seed(0)  # the same model every run: its AUC is a number, not a spread
    model = WideDeep(CRITEO.slots, num_dense=len(CRITEO.dense), emb_dim=8, hidden=(32,))
    trainer = sps.Trainer(model, dense_optimizer=sps.optim.Adam(lr=0.001),
                          strategy=sps.Strategy(mode="sync"))  # fmt: skip
    train = QueueDataset([train_path], schema=CRITEO, batch_size=128, threads=1)
    for _ in range(2):  # as tests/security/test_secure_job.py trains: AUC ~0.77
        trainer.train_from_dataset(train, print_period=0)
    metrics = trainer.evaluate(QueueDataset([test_path], schema=CRITEO, batch_size=4096))
    pause(folder, 2, rank)
    checks.append(exact_collectives(rank, world))
    record = {"rank": rank, "checks": checks, "test_auc": metrics.auc, "rows": metrics.count,
              "backend": dist.get_backend()}  # fmt: skip
    (folder / f"worker.{rank}.json").write_text(json.dumps(record))
    trainer.stop()
    sps.stop()
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
