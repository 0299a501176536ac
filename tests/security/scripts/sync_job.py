"""The job of tests/security/test_secure_sync_training.py: ``sync_job.py TRAIN TEST OUT``.

Servers serve; workers train a seeded wide&deep in sync mode (2 passes), evaluate, and
write ``OUT/worker.RANK.json``: the global test AUC, a hash of every dense parameter's
bytes and the group's backend.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.models import WideDeep


def main() -> int:
    train_path, test_path, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one summation order in every kernel: runs compare bit for bit
    model = WideDeep(CRITEO.slots, num_dense=len(CRITEO.dense), emb_dim=8, hidden=(32,))
    trainer = sps.Trainer(model, dense_optimizer=sps.optim.Adam(lr=0.001),
                          strategy=sps.Strategy(mode="sync"))  # fmt: skip
    train = QueueDataset([train_path], schema=CRITEO, batch_size=128, threads=1)
    for _ in range(2):
        trainer.train_from_dataset(train, print_period=0)
    metrics = trainer.evaluate(QueueDataset([test_path], schema=CRITEO, batch_size=4096))
    dense = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    record = {"test_auc": metrics.auc, "dense_sha256": hashlib.sha256(dense).hexdigest(),
              "backend": dist.get_backend()}  # fmt: skip
    (out / f"worker.{sps.worker_index()}.json").write_text(json.dumps(record))
    trainer.stop()
    sps.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
