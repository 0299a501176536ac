"""A local-mode job for tests/checkpoint/test_model_input.py: a small DNN trained on Criteo
TSV files, saved as an inference model and a checkpoint; then a second trainer that loads
the checkpoint and saves an inference model without training (a resumed job)."""

import argparse
from pathlib import Path

import torch

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.models import DNN

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--out", required=True)
args = p.parse_args()
out = Path(args.out)

torch.set_num_threads(1)
sps.init()


def make_trainer() -> sps.Trainer:
    torch.manual_seed(0)
    model = DNN(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(8,))
    return sps.Trainer(model, dense_optimizer=sps.optim.Adam(lr=0.01),
                       strategy=sps.Strategy(mode="sync"))  # fmt: skip


trainer = make_trainer()
trainer.train_from_dataset(QueueDataset([args.train], CRITEO, batch_size=100), print_period=0)
trainer.save_inference_model(out / "infer")
trainer.save_checkpoint(out / "ckpt")
trainer.stop()

resumed = make_trainer()  # a job restarted from the checkpoint, saving before it trains
resumed.load_checkpoint(out / "ckpt")
resumed.save_inference_model(out / "resumed")
resumed.stop()
sps.stop()
