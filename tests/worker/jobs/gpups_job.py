"""The 2-worker GPUPS job of tests/worker/test_gpups_cluster.py (run by ``sparseps launch``).

Every worker loads its share of the train files into an InMemoryDataset, then trains the
same WideDeep twice, --passes passes each (the first over its first 5 batches, the others
over all of them): once in sync mode (tables ``s_*``) and once in gpups mode on the CPU
(tables ``g_*``), which prepares each next pass during the one before it
(``Trainer.prefetch_pass``: the keys shared with that pass are carried over, the new ones
pulled early and sent to their owners). Worker 0 pulls every key of the data from
both, saves a checkpoint of the gpups model, trains one more pass, loads the checkpoint
back and pulls again, and writes it all to --out (npz + a JSON summary).
"""

import argparse
import json
import sys

import numpy as np

import sparseps as sps

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--keys", required=True)
p.add_argument("--out", required=True)
p.add_argument("--checkpoint", required=True)
p.add_argument("--passes", type=int, default=2)
args = p.parse_args()

sps.init()
if sps.is_server():
    sps.run_server()
    sys.exit(0)

import torch  # noqa: E402

from sparseps.data import CRITEO, InMemoryDataset  # noqa: E402
from sparseps.models import WideDeep  # noqa: E402


def model(prefix: str) -> WideDeep:
    torch.manual_seed(0)
    return WideDeep(
        CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(8,),
        deep_table=f"{prefix}_deep", wide_table=f"{prefix}_wide",
        deep_rule=sps.optim.Adam(lr=0.05, eps=1e-4),
        wide_rule=sps.optim.FTRL(alpha=0.1, beta=1.0, l1=0.01, l2=0.01),
    )  # fmt: skip


data = InMemoryDataset([args.train], CRITEO, batch_size=32, threads=1)
data.load_into_memory()
keys = np.load(args.keys)
summary, arrays = {"samples": len(data)}, {}
trainers = {}
for prefix, mode in (("s", "sync"), ("g", "gpups")):
    m = model(prefix)
    config = sps.GpuPS(device="cpu") if mode == "gpups" else sps.Sync()
    trainer = sps.Trainer(m, sps.optim.Adam(lr=0.01), sps.Strategy(mode=config))
    for i in range(args.passes):
        if mode == "gpups" and i + 1 < args.passes:
            trainer.prefetch_pass(data)
        result = trainer.train_from_dataset(data if i else list(data)[:5], print_period=0)
    summary[f"{mode}_timings"] = result.timings
    summary[f"{mode}_batches"] = result.batches
    for table in trainer.tables:
        arrays[table] = trainer.client.pull(table, keys).wait()
    arrays[f"{prefix}_dense"] = np.concatenate(
        [p.detach().numpy().ravel() for p in m.head.parameters()]
    )
    trainers[mode] = trainer
gpups = trainers["gpups"]
summary["last_build"] = gpups._mode.last_build
summary["rows"] = {
    name: int(t["rows"]) for name, t in gpups.client.stats()["total"]["tables"].items()
}
gpups.save_checkpoint(args.checkpoint)
gpups.train_from_dataset(data, print_period=0)
arrays["moved_deep"] = gpups.client.pull("g_deep", keys).wait()
gpups.load_checkpoint(args.checkpoint)
for table in gpups.tables:
    arrays[f"loaded_{table}"] = gpups.client.pull(table, keys).wait()
summary["test_count"] = gpups.evaluate(data).count
if sps.worker_index() == 0:
    np.savez(args.out, **arrays)
    with open(args.out + ".json", "w") as f:
        json.dump(summary, f)
for trainer in trainers.values():
    trainer.stop()
sps.stop()
