"""Work-stealing job for tests/data/test_work_stealing.py (run by ``sparseps launch``).

Every worker trains one async pass over --train with ``split="steal"`` and a journal;
every worker pauses --pause-s per batch, and worker --slow-rank then sleeps long enough
to make each of its batches take --slow-factor times as long as it would have (measured
per batch, so the factor holds however loaded the machine is). Each worker writes the
sample ids it trained and the files it read to ``--out/worker-<rank>.npz``.
"""

import argparse
import sys
import time

import numpy as np

import sparseps as sps

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--out", required=True)
p.add_argument("--journal", required=True)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--slow-rank", type=int, default=0)
p.add_argument("--slow-factor", type=float, default=3.0)
p.add_argument("--pause-s", type=float, default=0.03)
args = p.parse_args()

sps.init()
if sps.is_server():
    sps.run_server()
    sys.exit(0)

import torch  # noqa: E402

from sparseps.data import CRITEO, QueueDataset  # noqa: E402
from sparseps.models import WideDeep  # noqa: E402

torch.manual_seed(0)
rank = sps.worker_index()
model = WideDeep(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(8,),
                 deep_rule=sps.optim.SGD(lr=0.05), wide_rule=sps.optim.SGD(lr=0.05))  # fmt: skip
trainer = sps.Trainer(model, dense_optimizer=sps.optim.Adam(lr=0.01),
                      strategy=sps.Strategy(mode="async"))  # fmt: skip
train = QueueDataset([args.train], CRITEO, batch_size=args.batch_size, threads=1, split="steal",
                     journal=args.journal)  # fmt: skip
slow = rank == args.slow_rank
trained, times = [], []
last = [0.0]


def on_batch(step, stats):
    trained.append(np.asarray(step.batch.ids).copy())
    times.append(time.time())
    natural = time.perf_counter() - last[0] if last[0] else 0.0  # this batch's own time
    time.sleep(args.pause_s + (args.slow_factor - 1) * (natural + args.pause_s) * slow)
    last[0] = time.perf_counter()


sps.barrier_worker()  # start the pass together: the test measures who reads what
start = time.perf_counter()
trainer.train_from_dataset(train, print_period=0, on_batch=on_batch)
seconds = time.perf_counter() - start
np.savez(f"{args.out}/worker-{rank}.npz", ids=np.concatenate(trained) if trained else
         np.zeros(0, np.int64), files=np.array(train.files), seconds=seconds,
         times=np.array(times))  # fmt: skip
trainer.stop()
