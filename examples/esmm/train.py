"""ESMM-style multi-task training: CTR and CTCVR (click, then conversion) over shared embeddings.

    python examples/esmm/train.py [--rows 20000] [--passes 2] [--json]

Entire-space multi-task model (Ma et al., 2018, as in PaddleRec's ESMM): a CTR tower and a
CVR tower read the same sparse embeddings; ``pCTCVR = pCTR * pCVR`` is trained on every
impression against ``click AND conversion``, so the CVR tower never needs the biased
clicked-only sample. The labels are two columns (``Schema(label="click",
extra_labels=("conversion",))``); the loss reports one AUC per task (``ctr``, ``ctcvr``).

The data are planted (each id has a click weight and a conversion weight) and made here as
columnar batches; run alone it is a local job (1 background server, 1 worker), and under
``sparseps launch`` every worker trains its share.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import sparseps as sps
from sparseps.data.schema import Batch, Schema, Slot
from sparseps.worker.losses import Loss, LossOutput, label_column

SCHEMA = Schema(
    label="click", extra_labels=("conversion",), dense=(), slots=("user", "item", "ctx")
)


def planted_batches(rows: int, batch_size: int, seed: int, rank: int = 0, world: int = 1):
    """Batches of impressions: click ~ sigmoid(sum of click weights), conversion given a
    click ~ sigmoid(sum of conversion weights); ids of a slot are disjoint from others'."""
    weights = np.random.default_rng(100)  # the planted model: the same for every seed
    vocab = 200
    w_click = weights.normal(0.0, 1.0, (3, vocab))
    w_conv = weights.normal(0.0, 1.5, (3, vocab))
    rng = np.random.default_rng(seed)
    out = []
    for start in range(rank * batch_size, rows, world * batch_size):
        n = min(batch_size, rows - start)
        ids = rng.integers(0, vocab, (3, n))
        click_logit = w_click[np.arange(3)[:, None], ids].sum(0) - 1.0
        conv_logit = w_conv[np.arange(3)[:, None], ids].sum(0)
        click = (rng.random(n) < 1 / (1 + np.exp(-click_logit))).astype(np.float32)
        conv = click * (rng.random(n) < 1 / (1 + np.exp(-conv_logit)))
        offsets = np.arange(n + 1, dtype=np.int64)
        slots = {name: Slot((ids[s] + (s + 1) * 1_000_000).astype(np.uint64), offsets)
                 for s, name in enumerate(SCHEMA.slots)}  # fmt: skip
        extra = conv.astype(np.float32).reshape(-1, 1)
        out.append(Batch(click, np.zeros((n, 0), np.float32), slots,
                         np.arange(start, start + n, dtype=np.int64), extra))  # fmt: skip
    return out


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
    parser.add_argument("--rows", type=int, default=20_000)
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
    train = planted_batches(args.rows, args.batch_size, seed=1, rank=env.rank, world=env.worker_num)
    test = planted_batches(
        args.rows // 4, args.batch_size, seed=2, rank=env.rank, world=env.worker_num
    )
    for _ in range(args.passes):
        trainer.train_from_dataset(train, print_period=0)
    result = trainer.infer_from_dataset(test)
    summary = {f"test_auc_{name}": round(m.auc, 6) for name, m in result.tasks.items()}
    summary.update({f"test_count_{name}": m.count for name, m in result.tasks.items()})
    trainer.stop()
    sps.stop()
    if env.rank == 0:
        print(json.dumps(summary) if args.json else summary)


if __name__ == "__main__":
    main()
