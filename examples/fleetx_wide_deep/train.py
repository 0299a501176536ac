"""FleetX's parameter-server quick start (``examples/wide_and_deep_dataset/train.py``) in sparseps.

Each Paddle line is kept as a comment above its sparseps line. Run it as FleetX does,
from this folder, with the data files in ``./data`` (Criteo's raw tab-separated lines)::

    cd examples/fleetx_wide_deep
    sparseps launch --server-num 1 --worker-num 2 train.py   # fleetrun --server_num=1 --worker_num=2 train.py
    sparseps predict inference --data data/part-0            # the model's schema, format and reader
    sparseps serve inference --port 8080                     # requests of the model's columns

``reader.py`` is FleetX's reader with its import lines changed (README.md); every worker
reads every file, as FleetX's ``set_filelist`` of the whole list does (``split="none"``).
FleetX's script saves no model; this port adds ``fleet.save_inference_model``'s
counterpart, and the inference model records the schema, format and pipe command it was
trained with, so predict and serve need no flags. Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

# from paddle.distributed.fleet.utils.ps_util import DistributedInfer  (unused)
# import paddle.distributed.fleet as fleet
import sparseps as sps
from sparseps.data import QueueDataset

# from model import WideDeepModel
# from reader import WideDeepDatasetReader  (unused: the reader runs as the pipe command)
from model import WideDeepModel

# import paddle; paddle.enable_static()  -- sparseps models are torch modules


def distributed_training(trainer, train_model, train_data_path="./data", batch_size=4,
                         epoch_num=1):  # fmt: skip
    # dataset = paddle.distributed.QueueDataset()
    # thread_num = 1
    thread_num = 1
    # dataset.init(use_var=model.inputs, pipe_command="python reader.py", batch_size=batch_size,
    #              thread_num=thread_num)
    #   sparseps: the reader hashes ids with Python's hash(), salted per process, so each
    #   file (and predict, and serve) would get other ids; a fixed PYTHONHASHSEED fixes it
    #   (Paddle needs it as much) and, being in the command, the inference model records it
    pipe_command = "PYTHONHASHSEED=0 python reader.py"
    # train_files_list = [os.path.join(train_data_path, x) for x in os.listdir(train_data_path)]
    train_files_list = [os.path.join(train_data_path, x) for x in os.listdir(train_data_path)]
    # for epoch_id in range(epoch_num):
    #     dataset.set_filelist(train_files_list)   -- the whole list on every worker
    dataset = QueueDataset(train_files_list, train_model.inputs, batch_size, threads=thread_num,
                           pipe_command=pipe_command, format="multislot", split="none")  # fmt: skip
    result = None
    for _epoch_id in range(epoch_num):
        # exe.train_from_dataset(paddle.static.default_main_program(), dataset,
        #     paddle.static.global_scope(), debug=True, fetch_list=[train_model.cost],
        #     fetch_info=["loss"], print_period=1)
        result = trainer.train_from_dataset(dataset, print_period=1)
    return result


def main(argv=None) -> int:
    # (added: FleetX's script takes no options; these default to its values)
    ap = argparse.ArgumentParser(description="FleetX's wide&deep quick start on sparseps")
    ap.add_argument("--data", default="./data", help="folder of Criteo raw files (./data)")
    ap.add_argument("--batch-size", type=int, default=4, help="samples per batch (4)")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the data (1)")
    args = ap.parse_args(argv)
    # fleet.init(is_collective=False)
    sps.init()
    # model = WideDeepModel(); model.net(is_train=True)
    torch.manual_seed(0)
    model = WideDeepModel()
    network = model.net(is_train=True)
    # strategy = fleet.DistributedStrategy(); strategy.a_sync = True
    strategy = sps.Strategy(mode="async")
    # optimizer = paddle.optimizer.SGD(learning_rate=0.0001)
    optimizer = sps.optim.SGD(lr=0.0001)
    # optimizer = fleet.distributed_optimizer(optimizer, strategy); optimizer.minimize(model.cost)
    trainer = sps.Trainer(network, dense_optimizer=optimizer, strategy=strategy)
    # if fleet.is_server(): fleet.init_server(); fleet.run_server()
    if sps.is_server():
        sps.run_server()
        return 0
    # if fleet.is_worker(): place = paddle.CPUPlace(); exe = paddle.static.Executor(place)
    #     exe.run(paddle.static.default_startup_program()); fleet.init_worker()
    #     -- nothing: the trainer connects on first use
    # distributed_training(exe, model)
    result = distributed_training(trainer, model, args.data, args.batch_size, args.epochs)
    # clear_metric_state(model, place)  -- metrics start afresh every pass
    # (added: FleetX saves nothing) fleet.save_inference_model(exe, "inference", feeds, [pred])
    trainer.save_inference_model("inference")
    # fleet.stop_worker()
    rank = sps.worker_index()
    trainer.stop()
    sps.stop()
    if rank == 0:
        print(json.dumps({"rows": result.metrics.count, "auc": result.metrics.auc}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
