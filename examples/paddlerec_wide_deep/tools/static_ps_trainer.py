"""PaddleRec's ``tools/static_ps_trainer.py`` for ``models/rank/wide_deep`` in sparseps.

Run it as PaddleRec's parameter-server trainer is run, from this folder (the config's
``pipe_command`` names the reader relative to it), with the same config and overrides::

    cd examples/paddlerec_wide_deep
    sparseps launch --server-num 1 --worker-num 2 tools/static_ps_trainer.py \\
        -m models/rank/wide_deep/config_cpups.yaml -o runner.train_data_dir=/data/train
    sparseps predict model/0 --data /data/test/part-0    # the model's schema and reader
    sparseps serve model/0                                # requests of the model's columns

How ``config_cpups.yaml`` maps (docs/migrating-from-paddle.md, "PaddleRec's wide_deep"):

- ``runner.sync_mode`` async/sync/geo (``geo_step``) -> ``sps.Strategy(mode=...)``;
- ``hyper_parameters.optimizer`` (Adam, ``learning_rate``) -> the dense rule and the
  sparse table's rule; ``sparse_feature_number`` has no counterpart (tables grow);
- ``runner.reader_type`` QueueDataset/InmemoryDataset -> ``QueueDataset``/
  ``InMemoryDataset``; ``pipe_command`` -> the same command, with the config file and
  PaddleRec's utils folder appended as ``reader_helper.py`` does; ``thread_num`` ->
  ``threads``; ``train_batch_size``; ``split_file_list`` False -> ``split="none"`` (every
  worker reads every file), True -> the default ``split="static"``;
- ``runner.epochs`` -> passes, ``print_interval`` -> ``print_period``, ``use_auc`` ->
  nothing (every pass reports AUC); ``model_save_path`` -> an inference model per epoch in
  ``MODEL_SAVE_PATH/EPOCH`` (``fleet.save_inference_model``), which records the schema,
  format and pipe command, so ``sparseps predict`` and ``sparseps serve`` need no flags.

Paddle lines are kept as comments above their sparseps lines. Worker 0 prints one JSON
line at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch
import yaml

import sparseps as sps
from sparseps.data import InMemoryDataset, QueueDataset

__dir__ = os.path.dirname(os.path.abspath(__file__))


def load_yaml(path):
    """``common_ps.YamlHelper().load_yaml``: the ``runner`` and ``hyper_parameters`` keys,
    flattened to ``"runner.epochs"`` and so on (the reader loads the same file with
    PaddleRec's own ``common_ps.py``)."""
    with open(path, encoding="utf-8") as f:
        nested = yaml.safe_load(f)
    flat = {}

    def flatten(prefix, values):
        for key, value in values.items():
            if isinstance(value, dict):
                flatten([*prefix, key], value)
            else:
                flat[".".join([*prefix, key])] = value

    flatten([], copy.deepcopy(nested))
    return {k: v for k, v in flat.items() if k.startswith(("runner", "hyper_parameters"))}


def parse_args(argv=None):
    parser = argparse.ArgumentParser("PaddleRec train script")
    parser.add_argument("-o", "--opt", nargs="*", type=str)
    parser.add_argument("-m", "--config_yaml", type=str, required=True, help="config file path")
    args = parser.parse_args(argv)
    args.abs_dir = os.path.dirname(os.path.abspath(args.config_yaml))
    config = load_yaml(args.config_yaml)
    # modify config from command (as PaddleRec: the type of the value it replaces)
    for parameter in args.opt or []:
        key, value = parameter.strip().split("=", 1)
        kind = type(config.get(key))
        if kind is bool:
            value = value.lower() == "true"
        elif kind in (int, float):
            value = kind(value)
        config[key] = value
    config["yaml_path"] = args.config_yaml
    config["config_abs_dir"] = args.abs_dir
    return config


def get_strategy(config):
    # strategy = paddle.distributed.fleet.DistributedStrategy(); strategy.a_sync = ...
    sync_mode = config.get("runner.sync_mode")
    if sync_mode == "geo":  # a_sync_configs["k_steps"] = config.get("runner.geo_step")
        return sps.Strategy(mode=sps.Geo(k_steps=int(config.get("runner.geo_step"))))
    if sync_mode in ("sync", "async"):  # strategy.a_sync = sync_mode == "async"
        return sps.Strategy(mode=sync_mode)
    raise SystemExit(f"runner.sync_mode {sync_mode!r}: this port maps sync, async and geo")


def get_reader(schema, config):
    """``reader_helper.get_reader``: the dataset of ``runner.train_data_dir``."""
    # train_data_path = os.path.join(config["config_abs_dir"], train_data_dir)
    train_data_path = os.path.join(config["config_abs_dir"], config.get("runner.train_data_dir"))
    # file_list = [train_data_path + "/%s" % x for x in os.listdir(train_data_path)]
    file_list = [os.path.join(train_data_path, x) for x in sorted(os.listdir(train_data_path))]
    # if config.get("runner.split_file_list"): file_list = fleet.util.get_file_shard(file_list)
    split = "static" if config.get("runner.split_file_list") else "none"
    # pipe_command = "{} {} {}".format(pipe_command, config.get("yaml_path"), utils_path)
    utils_path = os.path.join(__dir__, "utils", "static_ps")
    pipe_command = "{} {} {}".format(
        config.get("runner.pipe_command"), os.path.abspath(config["yaml_path"]), utils_path
    )
    # dataset = paddle.distributed.QueueDataset()  (or InMemoryDataset)
    kind = (
        InMemoryDataset if config.get("runner.reader_type") == "InmemoryDataset" else QueueDataset
    )
    # dataset.init(use_var=input_var, pipe_command=pipe_command, batch_size=..., thread_num=...)
    # dataset.set_filelist(file_list)
    return kind(file_list, schema, int(config.get("runner.train_batch_size")),
                threads=int(config.get("runner.thread_num")), pipe_command=pipe_command,
                format="multislot", split=split)  # fmt: skip


def main(argv=None) -> int:
    config = parse_args(argv)
    sys.path.append(config["config_abs_dir"])  # get_model: model_path, next to the config
    from static_model import StaticModel

    # self.init_fleet_with_gloo(): fleet.init(role)
    sps.init()
    # self.model = get_model(self.config); self.input_data = self.model.create_feeds()
    torch.manual_seed(0)
    model = StaticModel(config)
    input_data = model.create_feeds()
    # self.metrics = self.model.net(self.input_data)
    network = model.net(input_data)
    # self.model.create_optimizer(get_strategy(self.config))
    trainer = sps.Trainer(network, dense_optimizer=model.create_optimizer(),
                          strategy=get_strategy(config))  # fmt: skip
    # if fleet.is_server(): fleet.init_server(...); fleet.run_server()
    if sps.is_server():
        sps.run_server()
        return 0
    # self.init_reader(): self.reader, self.file_list = get_reader(self.input_data, config)
    reader = get_reader(input_data, config)
    # if reader_type == "InmemoryDataset": self.reader.load_into_memory()
    if isinstance(reader, InMemoryDataset):
        reader.load_into_memory()
    save_model_path = config.get("runner.model_save_path")
    result = None
    # for epoch in range(epochs):
    for epoch in range(int(config.get("runner.epochs"))):
        # self.dataset_train_loop(epoch): exe.train_from_dataset(..., print_period=print_step)
        result = trainer.train_from_dataset(
            reader, print_period=int(config.get("runner.print_interval"))
        )
        # model_dir = "{}/{}".format(save_model_path, epoch)
        # fleet.save_inference_model(self.exe, model_dir, [feed.name for feed in
        #     self.inference_feed_var], self.inference_target_var)
        trainer.save_inference_model(f"{save_model_path}/{epoch}")
    # if reader_type == "InmemoryDataset": self.reader.release_memory()
    if isinstance(reader, InMemoryDataset):
        reader.release_memory()
    # fleet.stop_worker()
    rank = sps.worker_index()
    trainer.stop()
    sps.stop()
    if rank == 0:
        print(json.dumps({"rows": result.metrics.count, "auc": result.metrics.auc}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
