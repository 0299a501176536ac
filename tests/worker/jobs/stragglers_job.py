"""Straggler runs for tests/worker/test_stragglers.py (run by ``sparseps launch``).

Trains one pass per entry of --runs (a JSON list of ``{"name", "mode", "backup_workers",
"max_staleness", "slow", "factor", "base", "limit", "limits", "eval"}``;
``limits``: ``{rank: batches}`` for uneven data), each with a fresh WideDeep on its own tables, in this one job.
Each run measures this worker's seconds per step; in a run with ``"slow": true`` worker
--slow-rank sleeps ``factor`` (default --slow-factor) times the step of run ``base``
(default: the first run) after each step.
Every worker writes ``{name: {seconds, samples, batches, timings, test_auc, dense}}``
(``dense``: a digest of its dense parameters after the pass) to
--out/RANK.json.
"""

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import sparseps as sps

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--test", required=True)
p.add_argument("--out", required=True)
p.add_argument("--runs", required=True)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--slow-rank", type=int, default=2)
p.add_argument("--slow-factor", type=float, default=3.0)
args = p.parse_args()

sps.init()
if sps.is_server():
    sps.run_server()
    sys.exit(0)

import torch  # noqa: E402

from sparseps.data import CRITEO, QueueDataset  # noqa: E402
from sparseps.models import WideDeep  # noqa: E402

rank = sps.worker_index()


class Limited:
    """The first ``limit`` batches of this worker's share (a shorter pass)."""

    def __init__(self, dataset, limit):
        self.dataset, self.limit = dataset, limit

    def __iter__(self):
        for index, batch in enumerate(self.dataset):
            if index >= self.limit:
                return
            yield batch


files = sorted(str(f) for f in Path(args.train).glob("part-*"))
train = QueueDataset(files, CRITEO, batch_size=args.batch_size, threads=1)
test = QueueDataset([args.test], CRITEO, batch_size=512, threads=1)
report = {}
for run in json.loads(args.runs):
    torch.manual_seed(0)
    model = WideDeep(
        CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(16,),
        deep_rule=sps.optim.SGD(lr=0.05), wide_rule=sps.optim.Adagrad(lr=0.05),
        deep_table=f"deep_{run['name']}", wide_table=f"wide_{run['name']}",
    )  # fmt: skip
    mode = (
        sps.Sync(backup_workers=run.get("backup_workers", 0))
        if run["mode"] == "sync"
        else sps.Async(max_staleness=run.get("max_staleness"))
    )
    strategy = sps.Strategy(mode=mode, collective_timeout=120.0)
    trainer = sps.Trainer(model, dense_optimizer=sps.optim.Adam(lr=0.01), strategy=strategy)
    slow = run.get("slow") and rank == args.slow_rank
    base = report[run.get("base", next(iter(report)))]["step_s"] if report else 0.0
    pause = run.get("factor", args.slow_factor) * base

    def on_batch(step, stats, slow=slow, pause=pause):
        if slow:
            time.sleep(pause)

    limit = run.get("limits", {}).get(str(rank), run.get("limit"))  # uneven: per rank
    data = Limited(train, limit) if limit else train
    result = trainer.train_from_dataset(data, print_period=0, on_batch=on_batch)
    step_s = result.seconds / max(result.batches, 1)
    auc = trainer.evaluate(test).auc if run.get("eval") else None
    dense = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.parameters()))
    trainer.stop()
    report[run["name"]] = {
        "seconds": result.seconds, "samples": result.samples, "batches": result.batches,
        "timings": result.timings, "test_auc": auc, "step_s": step_s,
        "dense": dense.hexdigest(),
    }  # fmt: skip
Path(args.out).mkdir(parents=True, exist_ok=True)
Path(args.out, f"{rank}.json").write_text(json.dumps(report))
sps.stop()
