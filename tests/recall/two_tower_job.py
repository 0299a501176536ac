"""The two-tower recall job of test_recall (run by ``sparseps launch`` on every role).

Usage: two_tower_job.py DATA_DIR OUT_DIR. Trains TwoTower with in-batch negatives on
DATA_DIR/train-*.parquet (one file per worker), then dumps item vectors (key ``item``)
and user vectors (key ``user``), each key once over all workers.
"""

import json
import sys
from pathlib import Path

import sparseps as sps

data, out = Path(sys.argv[1]), Path(sys.argv[2])
sps.init()
if sps.is_server():  # tables come from the workers: the server never imports torch
    sps.run_server()
    sys.exit(0)

import torch  # noqa: E402

from sparseps.data import InMemoryDataset, Schema  # noqa: E402
from sparseps.models import InBatchSoftmax, TwoTower  # noqa: E402

SCHEMA = Schema(label="label", dense=(), slots=("user", "item", "item_cat"))
torch.manual_seed(0)
model = TwoTower(("user",), ("item", "item_cat"), emb_dim=8, hidden=(16,), out_dim=8,
                 temperature=0.1, rule=sps.optim.Adagrad(lr=0.1))  # fmt: skip
trainer = sps.Trainer(
    model, dense_optimizer=sps.optim.Adam(lr=0.01), strategy=sps.Strategy(mode="sync"),
    loss=InBatchSoftmax(item_key="item"),
)  # fmt: skip
files = sorted(str(p) for p in data.glob("train-*.parquet"))
train = InMemoryDataset(files, SCHEMA, batch_size=64, threads=1, format="parquet")
train.load_into_memory()
losses = []
for epoch in range(4):
    train.global_shuffle(seed=epoch)
    result = trainer.train_from_dataset(
        train, print_period=0, on_batch=lambda s, st: st.add("loss", s.loss)
    )
    losses.append(result.stats["loss"] / max(result.batches, 1))
items = trainer.predict_from_dataset(train, out / "items", key="item", outputs=("item_vec",),
                                     unique_keys=True)  # fmt: skip
users = trainer.predict_from_dataset(train, out / "users", key="user", outputs=("user_vec",),
                                     unique_keys=True)  # fmt: skip
if sps.worker_index() == 0:
    (out / "summary.json").write_text(json.dumps({"losses": losses, "items": items.rows,
                                                  "users": users.rows}))  # fmt: skip
trainer.stop()
sps.stop()
