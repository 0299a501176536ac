"""A PaddleRec-style DNN job for Paddle PS (static_ps), ported to sparseps line by line.

Each Paddle line is kept as a comment above its sparseps line. Run it alone (local mode)
or under a launcher (``sparseps launch --server-num 1 --worker-num 2 train.py ...``, or
Paddle's own launcher/operator: sparseps reads TRAINING_ROLE/PADDLE_* too)::

    python examples/paddle_port/train.py --train tests/fixtures/criteo_slot_sample.txt \\
        --test tests/fixtures/criteo_slot_sample.txt --out /tmp/paddle_port

The data go through reader.py (PaddleRec's MultiSlotDataGenerator reader, its changes
listed at its top) as the dataset's pipe_command ``python reader.py``, read with
format="multislot". A bare ``python`` in a pipe command is the job's own interpreter, so
the job runs through the full path of a virtual environment's ``bin/sparseps`` without
that environment on PATH. Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import torch

# import paddle
# import paddle.distributed.fleet as fleet
import sparseps as sps
from sparseps.data import InMemoryDataset, QueueDataset, Schema

HERE = os.path.dirname(os.path.abspath(__file__))
SPARSE = tuple(str(i) for i in range(1, 27))
# feeds = [click, 1..26, dense_feature]; dataset.set_use_var(feeds)
SCHEMA = Schema("click", ("dense_feature",) * 13, SPARSE, dense_transform="raw",
                multislot_order=("click", *SPARSE, "dense_feature"))  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args(argv)
    pipe = f"python {shlex.quote(os.path.join(HERE, 'reader.py'))}"  # Paddle's "python reader.py"

    # fleet.init(is_collective=False)
    sps.init()
    # strategy = fleet.DistributedStrategy(); strategy.a_sync = True
    strategy = sps.Strategy(mode="async")
    # model: paddle.static.nn.sparse_embedding(26 slots, size=[.., 9]) + fc 400-400-400
    torch.manual_seed(0)
    model = sps.models.DNN(SPARSE, 13, emb_dim=9, hidden=(64, 64))
    # optimizer = fleet.distributed_optimizer(paddle.optimizer.Adam(0.001), strategy)
    trainer = sps.Trainer(model, dense_optimizer=sps.optim.Adam(lr=0.001), strategy=strategy)
    # if fleet.is_server(): fleet.init_server(); fleet.run_server()
    if sps.is_server():
        sps.run_server()
        return 0
    # fleet.init_worker()  -- the trainer connects on first use
    # dataset = paddle.distributed.InMemoryDataset()
    # dataset.init(batch_size=..., thread_num=1, pipe_command="python reader.py", use_var=feeds)
    # dataset.set_filelist(files); dataset.load_into_memory(); dataset.global_shuffle()
    dataset = InMemoryDataset(args.train, SCHEMA, args.batch_size, threads=1, pipe_command=pipe,
                              format="multislot")  # fmt: skip
    dataset.load_into_memory()
    dataset.global_shuffle(seed=0)
    # exe.train_from_dataset(program, dataset, fetch_list=[auc], print_period=...)
    result = trainer.train_from_dataset(dataset, print_period=0)
    # dataset.release_memory()
    dataset.release_memory()
    # fleet.metrics.auc(...) on a test QueueDataset
    test = QueueDataset(args.test, SCHEMA, args.batch_size, pipe_command=pipe, format="multislot")
    metrics = trainer.evaluate(test)
    # fleet.save_persistables(exe, out); fleet.save_inference_model(exe, out, feeds, [pred])
    trainer.save_checkpoint(os.path.join(args.out, "ckpt"))
    trainer.save_inference_model(os.path.join(args.out, "infer"))
    # fleet.stop_worker()
    trainer.stop()
    sps.stop()
    summary = {"rows": result.metrics.count, "test_auc": metrics.auc, "test_rows": metrics.count}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
