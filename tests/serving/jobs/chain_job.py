"""A training job that writes an inference chain for the serving tests (local mode).

Before each save it trains one pass over ``--train``; ``--saves`` lists the saves in
order (``b`` base, ``d`` delta), e.g. ``b,d,d,b``. Each save goes to ``--model``. It also
writes ``--legacy-head``: the head of the last base as TorchScript (what saves held
before ``torch.export``), for the legacy-load test. Worker 0 writes a JSON summary to ``--out``.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.models import WideDeep

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--model", required=True)
p.add_argument("--saves", required=True)
p.add_argument("--legacy-head", required=True)
p.add_argument("--out", required=True)
args = p.parse_args()

torch.set_num_threads(1)  # a tiny model on a shared machine: no OpenMP fan-out
sps.init()
torch.manual_seed(0)
model = WideDeep(
    CRITEO.slots,
    len(CRITEO.dense),
    emb_dim=4,
    hidden=(16,),
    deep_rule=sps.optim.SGD(lr=0.05),
    wide_rule=sps.optim.Adagrad(lr=0.05),
)
trainer = sps.Trainer(
    model,
    dense_optimizer=sps.optim.Adam(lr=0.01),
    strategy=sps.Strategy(mode="sync", dense_pull_interval=1),
)
if sps.is_server():
    sps.run_server()
    sys.exit(0)

train = QueueDataset([args.train], CRITEO, batch_size=100, threads=1)
folders = []
for kind in args.saves.split(","):
    trainer.train_from_dataset(train, print_period=0)
    mode = {"b": "base", "d": "delta"}[kind]
    folders.append(Path(trainer.save_inference_model(args.model, mode=mode)).name)
    if mode == "base" and sps.worker_index() == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.script(model.head.eval()).save(args.legacy_head)
        model.head.train()
if sps.worker_index() == 0:
    Path(args.out).write_text(json.dumps({"saves": folders}))
trainer.stop()
sps.stop()
