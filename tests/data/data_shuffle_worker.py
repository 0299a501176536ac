"""One worker of the global_shuffle tests: join a gloo group on loopback, load, shuffle, dump ids.

Usage: python data_shuffle_worker.py RANK WORLD PORT FOLDER OUT.npy [extra] [-- FOLDER OUT.npy [extra]]...

Each ``FOLDER OUT`` is loaded, shuffled and dumped in turn, over the one gloo group (the
tests' two data sets share a pair of processes: each start is seconds of imports). With
``extra`` the files carry one extra label column ``conv`` after the label (schema
``EXTRA``), and OUT also holds each sample's ``Batch.extra_labels``. A deprecated
collective or a read-only buffer handed to torch is an error here.
"""

import datetime
import sys
import warnings

import numpy as np
import torch.distributed as dist

from sparseps.data import CRITEO, InMemoryDataset, Schema

EXTRA = Schema("label", CRITEO.dense, CRITEO.slots, extra_labels=("conv",))


def main() -> int:
    # the exchange must not use deprecated collectives nor hand torch read-only buffers
    warnings.filterwarnings("error", category=FutureWarning, module="torch.distributed")
    warnings.filterwarnings("error", message=".*NumPy array is not writable")
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    runs, run = [], []
    for arg in sys.argv[4:] + ["--"]:
        if arg == "--":
            runs.append(run)
            run = []
        else:
            run.append(arg)
    for folder, out, *flags in runs:
        shuffle(rank, world, folder, out, extra=flags == ["extra"])
    dist.destroy_process_group()
    return 0


def shuffle(rank: int, world: int, folder: str, out: str, *, extra: bool) -> None:
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


if __name__ == "__main__":
    sys.exit(main())
