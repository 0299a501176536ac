"""The seed system's wide&deep quick start, in sparseps.

    sparseps gen-data --rows 200000 --out data
    sparseps launch --server-num 1 --worker-num 2 examples/wide_deep/train.py data/train data/test
    python examples/wide_deep/train.py data/train data/test        # local mode: no launcher

The same script runs on every role: servers serve, workers train on their share of the
files and print global test metrics.
"""

import sys

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.models import WideDeep

train_path, test_path = sys.argv[1], sys.argv[2]

sps.init()
model = WideDeep(CRITEO.slots, num_dense=len(CRITEO.dense), emb_dim=8, hidden=(400, 400, 400))
trainer = sps.Trainer(
    model, dense_optimizer=sps.optim.Adam(lr=0.001), strategy=sps.Strategy(mode="async")
)

if sps.is_server():
    sps.run_server()
else:
    train = QueueDataset([train_path], schema=CRITEO, batch_size=512, threads=1)
    trainer.train_from_dataset(train, print_period=100)
    metrics = trainer.evaluate(QueueDataset([test_path], schema=CRITEO, batch_size=4096))
    if sps.worker_index() == 0:
        print(f"test auc: {metrics.auc:.4f}  logloss: {metrics.logloss:.4f}  rows: {metrics.count}")
    trainer.stop()
    sps.stop()
