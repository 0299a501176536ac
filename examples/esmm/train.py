"""ESMM-style multi-task training: CTR and CTCVR (click, then conversion) over shared embeddings.

    python examples/esmm/train.py --train data/train --test data/test [--format criteo_tsv]
        [--passes 2] [--json]

Entire-space multi-task model (Ma et al., 2018, as in PaddleRec's ESMM): a CTR tower and a
CVR tower read the same sparse embeddings; ``pCTCVR = pCTR * pCVR`` is trained on every
impression against ``click AND conversion``, so the CVR tower never needs the biased
clicked-only sample. The labels are two columns (``Schema(label="click",
extra_labels=("conversion",))``); the loss reports one AUC per task (``ctr``, ``ctcvr``).

The data are files (or folders of files) in any format of :mod:`sparseps.data`; a line of
the default, tab-separated ``criteo_tsv`` layout holds the labels first, then the slots
(ids as strings, hashed per slot)::

    1<TAB>0<TAB>u_17<TAB>i_93<TAB>c_4        click, conversion, user, item, ctx

(``multislot`` lines, as a Paddle ESMM reader prints them, hold the slots in the same
order: ``1 1 1 0 1 17 1 93 1 4``). Every worker reads its share of the files, which are
loaded into memory once and shuffled every pass; run alone it is a local job (1
background server, 1 worker), and under ``sparseps launch`` every worker trains its share.
``tests/worker/test_esmm_example.py`` writes planted data and runs it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import sparseps as sps
from sparseps.data import Format, InMemoryDataset, QueueDataset, Schema
from sparseps.worker.losses import Loss, LossOutput, label_column

SCHEMA = Schema(
    label="click", extra_labels=("conversion",), dense=(), slots=("user", "item", "ctx")
)


class ESMM(nn.Module):
    """Shared embeddings; a CTR tower and a CVR tower; ``forward`` -> logits ``[B, 2]``."""

    def __init__(self, emb_dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.emb = sps.nn.SparseEmbedding("esmm_emb", emb_dim, slots=SCHEMA.slots,
                                          rule=sps.optim.Adagrad(lr=0.05))  # fmt: skip
        width = emb_dim * len(SCHEMA.slots)
        self.ctr = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.cvr = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, batch) -> torch.Tensor:
        x = self.emb(batch).flatten(1)
        return torch.cat([self.ctr(x), self.cvr(x)], 1)


class ESMMLoss(Loss):
    """``BCE(pCTR, click) + BCE(pCTR * pCVR, click * conversion)``, summed over the batch."""

    tasks = ("ctr", "ctcvr")

    def __call__(self, model, batch) -> LossOutput:
        logits = model(batch)
        p_ctr = torch.sigmoid(logits[:, 0])
        p_ctcvr = (p_ctr * torch.sigmoid(logits[:, 1])).clamp(1e-7, 1 - 1e-7)
        click = torch.from_numpy(label_column(batch, 0))
        ctcvr = click * torch.from_numpy(label_column(batch, 1))
        loss = F.binary_cross_entropy_with_logits(logits[:, 0], click, reduction="sum")
        loss = loss + F.binary_cross_entropy(p_ctcvr, ctcvr, reduction="sum")
        preds = torch.stack([p_ctr, p_ctcvr], 1).detach().numpy().astype(np.float32)
        return LossOutput(loss, preds, torch.stack([click, ctcvr], 1).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, nargs="+", help="training files or folders")
    parser.add_argument("--test", required=True, nargs="+", help="test files or folders")
    parser.add_argument("--format", default="criteo_tsv", choices=[f.value for f in Format])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = sps.init()
    torch.manual_seed(0)
    trainer = sps.Trainer(ESMM(), dense_optimizer=sps.optim.Adam(lr=0.005),
                          strategy=sps.Strategy(mode="sync"), loss=ESMMLoss())  # fmt: skip
    if sps.is_server():
        sps.run_server()
        return
    train = InMemoryDataset(args.train, SCHEMA, args.batch_size, format=args.format)
    train.load_into_memory()
    for seed in range(args.passes):
        train.local_shuffle(seed=seed)
        trainer.train_from_dataset(train, print_period=0)
    test = QueueDataset(args.test, SCHEMA, args.batch_size, format=args.format)
    result = trainer.infer_from_dataset(test)
    summary = {f"test_auc_{name}": round(m.auc, 6) for name, m in result.tasks.items()}
    summary.update({f"test_count_{name}": m.count for name, m in result.tasks.items()})
    summary.update({f"test_positives_{name}": m.clicks for name, m in result.tasks.items()})
    trainer.stop()
    sps.stop()
    if env.rank == 0:
        print(json.dumps(summary) if args.json else summary)


if __name__ == "__main__":
    main()
