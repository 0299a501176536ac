"""A scripted job for the model-file tests: one trainer runs a list of steps, in order.

Run it alone (local mode: one background server, one worker) or under ``sparseps
launch``. ``--steps`` is a comma-separated list; each step writes what it saw into the
JSON summary at ``--out`` (worker 0):

- ``train``: one pass over ``--train``;
- ``shrink``: ``trainer.shrink()``; records the deleted keys per table;
- ``save=DIR`` / ``load=DIR``: checkpoint save / load (a ``CheckpointError`` on load is
  appended to ``load_errors`` and the job goes on: the load failed before changing state);
- ``base=DIR`` / ``delta=DIR``: inference save, then ``Predictor(DIR)`` against the
  trainer's predictions on ``--test`` (max abs difference), the save's rows and
  tombstones, and how many of the keys shrink deleted the Predictor still holds;
- ``delta-interrupted=DIR``: a delta save that fails after the servers wrote their rows
  and before the save is in place (a crash of worker 0 there).
"""

import argparse
import gc
import json
import sys
from pathlib import Path

import numpy as np
import torch

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.models import WideDeep

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--test", required=True)
p.add_argument("--out", required=True)
p.add_argument("--steps", required=True)
p.add_argument("--mode", default="sync")
p.add_argument("--emb-dim", type=int, default=4)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--shrink-score", type=float, default=0.0)
p.add_argument("--admission", default="always")
p.add_argument("--admit-count", type=int, default=1)
args = p.parse_args()

sps.init()
torch.manual_seed(0)
lifecycle = sps.Lifecycle(
    shrink_score=args.shrink_score, admission=args.admission, admit_count=args.admit_count
)
model = WideDeep(
    CRITEO.slots,
    len(CRITEO.dense),
    emb_dim=args.emb_dim,
    hidden=(16,),
    deep_rule=sps.optim.SGD(lr=args.lr),
    wide_rule=sps.optim.Adagrad(lr=args.lr),
    lifecycle=lifecycle,
)
trainer = sps.Trainer(
    model,
    dense_optimizer=sps.optim.Adam(lr=0.01),
    strategy=sps.Strategy(mode=args.mode, dense_pull_interval=1),
)
if sps.is_server():
    sps.run_server()
    gc.freeze()  # as at the end below
    sys.exit(0)

from sparseps.checkpoint.hooks import SaveHooks  # noqa: E402
from sparseps.checkpoint.predictor import Predictor  # noqa: E402
from sparseps.errors import CheckpointError  # noqa: E402
from sparseps.files import manifest as mf  # noqa: E402

train = QueueDataset([args.train], CRITEO, batch_size=16, threads=1)
test = QueueDataset([args.test], CRITEO, batch_size=64, threads=1)
summary: dict = {"predict": [], "deleted": {}, "interrupted": [], "load_errors": []}
deleted: dict[str, np.ndarray] = {}


def inference_save(directory: str, mode: str) -> None:
    folder = trainer.save_inference_model(directory, mode=mode)
    if sps.worker_index() != 0:
        return
    ours = trainer.infer_from_dataset(test).predictions
    predictor = Predictor(directory)
    theirs = predictor.predict(test)
    manifest = mf.read_manifest(folder)
    summary["predict"].append(
        {
            "folder": Path(folder).name,
            "chain": [f.name for f in predictor.saves],
            "diff": float(np.abs(ours - theirs).max()),
            "rows": {t: e["rows"] for t, e in manifest["tables"].items()},
            "tombstones": {t: e["tombstones"] for t, e in manifest["tables"].items()},
            "deleted_still_served": {
                t: int(np.isin(keys, predictor.tables[t].keys).sum()) for t, keys in deleted.items()
            },
        }
    )


def interrupted_delta(directory: str) -> None:
    class Crash(SaveHooks):
        def after_table_saved(self, table):
            raise RuntimeError(f"injected crash after the servers saved {table}")

    try:
        trainer.save_inference_model(directory, mode="delta", hooks=Crash())
    except RuntimeError as exc:
        summary["interrupted"].append(str(exc))


for step in args.steps.split(","):
    what, _, where = step.partition("=")
    if what == "train":
        trainer.train_from_dataset(train, print_period=0)
    elif what == "shrink":
        trainer.shrink()
        deleted = {t: trainer.tombstones(t) for t in trainer.tables}
        summary["deleted"] = {t: int(k.size) for t, k in deleted.items()}
    elif what == "save":
        trainer.save_checkpoint(where)
    elif what == "load":
        try:
            summary["load_state"] = trainer.load_checkpoint(where)
        except CheckpointError as exc:
            summary["load_errors"].append(str(exc))
            continue
        summary["tombstones_after_load"] = {
            t: int(trainer.tombstones(t).size) for t in trainer.tables
        }
    elif what in ("base", "delta"):
        inference_save(where, what)
    elif what == "delta-interrupted":
        interrupted_delta(where)
    else:
        raise SystemExit(f"model_job: unknown step {step!r}")

if sps.worker_index() == 0:
    summary["pending"] = {
        t: v["pending"] for t, v in trainer.client.stats()["total"]["tables"].items()
    }
    Path(args.out).write_text(json.dumps(summary))
trainer.stop()
sps.stop()
# the process exits next: its objects (torch's modules, the job's state) go to the
# permanent generation, so the interpreter's last collections do not walk them (~1 s of
# CPU per process, paid while the test waits for the job to end)
gc.freeze()
