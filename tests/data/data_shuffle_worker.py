"""One worker of the global_shuffle test: join a gloo group on loopback, load, shuffle, dump ids.

Usage: python data_shuffle_worker.py RANK WORLD PORT FOLDER OUT.npy [extra]

With ``extra`` the files carry one extra label column ``conv`` after the label (schema
``EXTRA``), and OUT also holds each sample's ``Batch.extra_labels``.
"""

import datetime
import sys

import numpy as np
import torch.distributed as dist

from sparseps.data import CRITEO, InMemoryDataset, Schema

EXTRA = Schema("label", CRITEO.dense, CRITEO.slots, extra_labels=("conv",))


def main() -> int:
    rank, world, port, folder, out = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        sys.argv[3],
        sys.argv[4],
        sys.argv[5],
    )
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    extra = sys.argv[6:] == ["extra"]
    schema = EXTRA if extra else CRITEO
    ds = InMemoryDataset(folder, schema, batch_size=16, rank=rank, world=world)
    ds.load_into_memory()
    before = len(ds)
    ds.global_shuffle(seed=11, timeout=30)
    batches = list(ds)
    ids = np.concatenate([b.ids for b in batches])
    # each sample keeps its content: the label column was written as the id's parity
    labels = np.concatenate([b.label for b in batches])
    c1 = np.concatenate([b.slots["C1"].values for b in batches])
    more = {"extra": np.concatenate([b.extra_labels for b in batches])} if extra else {}
    np.savez(out, ids=ids, labels=labels, c1=c1, before=before, **more)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
