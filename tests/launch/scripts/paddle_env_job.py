"""A job started the way Paddle's launcher/operator starts roles: only PADDLE_* variables.

``paddle_env_job.py DATA_DIR OUT_DIR``: servers serve; each worker trains one pass of a
DNN on its share of DATA_DIR/train, evaluates DATA_DIR/test and writes OUT_DIR/worker.R.json.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import sparseps as sps


def main() -> int:
    data, out = Path(sys.argv[1]), Path(sys.argv[2])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    env = sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    import torch  # here: the server never imports torch (seconds of CPU on 2 cores)

    from sparseps.data import CRITEO, QueueDataset

    torch.manual_seed(0)
    model = sps.models.DNN(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(16,))
    trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode="async"))
    train = QueueDataset(data / "train", CRITEO, 256)  # this worker's share, from the env
    result = trainer.train_from_dataset(train, print_period=0)
    test = trainer.evaluate(QueueDataset(data / "test", CRITEO, 256))
    record = {
        "rank": env.rank, "world": env.worker_num, "servers": list(env.servers),
        "job_id": env.job_id, "master": env.master, "files": train.files,
        "train_count": result.metrics.count, "test_auc": test.auc, "test_count": test.count,
    }  # fmt: skip
    (out / f"worker.{env.rank}.json").write_text(json.dumps(record))
    trainer.stop()
    sps.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
