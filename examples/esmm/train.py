"""ESMM-style multi-task training: CTR and CTCVR (click, then conversion) over shared embeddings.

    python examples/esmm/train.py --train data/train --test data/test [--format criteo_tsv]
        [--passes 2] [--json] [--out out/esmm]

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

The model is a :class:`sparseps.nn.SparseModel` (the shared embeddings, and a head that
maps them to the two towers' logits), so ``--out DIR`` saves it as an inference model:
``sparseps predict DIR --data FILE`` reads FILE as the model was trained (the schema and
format the save records) and prints two columns per row, ``pCTR`` and ``pCVR`` (the
sigmoid of each logit; ``pCTCVR`` is their product); ``sparseps.Predictor(DIR)`` gives
them as an array ``[rows, 2]``. ``tests/checkpoint/test_esmm_inference.py`` checks it.
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


class ESMMHead(nn.Module):
    """The two towers over the pooled embeddings: ``(dense [B, 0], emb [B, 3, dim]) ->
    logits [B, 2]`` (CTR, CVR). The schema has no dense column; the head takes the empty
    dense input all heads take, so it exports as one."""

    def __init__(self, emb_dim: int, hidden: int) -> None:
        super().__init__()
        width = emb_dim * len(SCHEMA.slots)
        self.ctr = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.cvr = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x = emb.flatten(1)
        return torch.cat([self.ctr(x), self.cvr(x)], 1)


class ESMM(sps.nn.SparseModel):
    """Shared embeddings; a CTR tower and a CVR tower; ``forward`` -> logits ``[B, 2]``."""

    def __init__(self, emb_dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList([
            sps.nn.SparseEmbedding("esmm_emb", emb_dim, slots=SCHEMA.slots,
                                   rule=sps.optim.Adagrad(lr=0.05)),
        ])  # fmt: skip
        self.head = ESMMHead(emb_dim, hidden)

    def forward(self, batch) -> torch.Tensor:
        # both logits per row (SparseModel.forward flattens a head's output to one per row)
        return self.head(sps.nn.dense_tensor(batch), *(e(batch) for e in self.embeddings))


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
    parser.add_argument("--out", help="save the trained model here as an inference model")
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
    if args.out:  # collective: every worker calls it; it records SCHEMA and the format
        summary["inference_model"] = str(trainer.save_inference_model(args.out))
    trainer.stop()
    sps.stop()
    if env.rank == 0:
        print(json.dumps(summary) if args.json else summary)


if __name__ == "__main__":
    main()
