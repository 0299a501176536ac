"""PaddleRec's ``tools/static_ps_online_trainer.py`` for ``models/rank/slot_dnn`` in sparseps.

Run it as PaddleRec's online trainer is run, from the model's folder (the config's
``train_data_dir`` and ``pipe_command`` are relative to it), with the same config::

    cd examples/slot_dnn/models/rank/slot_dnn
    sparseps launch --server-num 1 --worker-num 2 ../../../tools/static_ps_online_trainer.py \\
        -m config_online.yaml
    sparseps predict output_model/20190720 --data data/20190720/0000/part-0

The data are ``train_data_dir/DAY/HHMM/*`` for each day from ``start_day`` to ``end_day``
(a folder every ``split_interval`` minutes, ``split_per_pass`` folders a pass:
``prepare_online_data.sh``'s layout). Per pass: an evaluation of the pass's data before
training on it (the "Infer Global Metric"), training, a checkpoint every
``checkpoint_per_pass`` passes (``model_save_path/DAY/PASS``), an inference save every
``save_delta_frequency`` passes; at the end of a day the table's decay and shrink
(``fleet.shrink()``), the next day's base inference model and a checkpoint of the whole
model (``save_batch_model``: ``DAY/0``). How each setting maps is in
docs/migrating-from-paddle.md ("PaddleRec's slot_dnn"); what this port adds or leaves out:

- ``-o KEY=VALUE`` overrides a config value (``runner.end_day=20190720``,
  ``table_parameters.embedding.accessor.embedx_threshold=5``), as PaddleRec's
  ``static_ps_trainer.py`` does; its online trainer has no ``-o``;
- inference saves are sparseps chains: ``model_save_path/DAY`` holds the day's base
  (``base-NNNNN``, Paddle's ``DAY/base``) and its deltas (``delta-NNNNN``, Paddle's
  ``DAY/delta-PASS``); a day with no base yet (the first: ``save_first_base`` False)
  starts its chain with a base where Paddle writes its first delta;
- a ``python3.N`` at the start of ``pipe_command`` runs as ``python``, the job's
  interpreter (which has sparseps);
- not ported: donefiles and resuming from them, HDFS (``fs_client``), ``need_train_dump``.

Paddle lines are kept as comments above their sparseps lines. Worker 0 prints one JSON
line at the end.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import logging
import os
import re
import sys

import torch
import yaml

import sparseps as sps
from sparseps.data import InMemoryDataset, QueueDataset

__dir__ = os.path.dirname(os.path.abspath(__file__))
UTILS = os.path.join(__dir__, "utils", "static_ps")
log = logging.getLogger("static_ps_online_trainer")


def load_yaml(path):
    """``YamlHelper().load_yaml(path, ["table_parameters"])``: ``runner`` and
    ``hyper_parameters`` flattened to ``"runner.epochs"`` and so on, ``table_parameters``
    kept as a tree."""
    with open(path, encoding="utf-8") as f:
        nested = yaml.safe_load(f)
    flat = {}

    def flatten(prefix, values):
        for key, value in values.items():
            if isinstance(value, dict) and prefix != ["table_parameters"]:
                flatten([*prefix, key], value)
            else:
                flat[".".join([*prefix, key])] = value

    flatten([], copy.deepcopy(nested))
    tables = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith("table_parameters.")}
    config = {k: v for k, v in flat.items() if k.startswith(("runner", "hyper_parameters"))}
    config["table_parameters"] = tables
    return config


def _typed(value, like):
    """A ``-o`` value as the type of the value it replaces (PaddleRec's rule)."""
    if isinstance(like, bool):
        return value.lower() == "true"
    if isinstance(like, int | float):
        return type(like)(float(value)) if isinstance(like, int) else float(value)
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser("PaddleRec train script")
    parser.add_argument("-m", "--config_yaml", type=str, required=True, help="config file path")
    parser.add_argument("-o", "--opt", nargs="*", type=str, help="KEY=VALUE overrides")
    args = parser.parse_args(argv)
    args.abs_dir = os.path.dirname(os.path.abspath(args.config_yaml))
    config = load_yaml(args.config_yaml)
    for parameter in args.opt or []:
        key, value = parameter.strip().split("=", 1)
        if key.startswith("table_parameters."):  # a field of the table's tree
            *path, last = key.split(".")[1:]
            node = config["table_parameters"]
            for part in path:
                node = node.setdefault(part, {})
            node[last] = _typed(value, node.get(last))
        else:
            config[key] = _typed(value, config.get(key))
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


def get_online_pass_interval(split_interval, split_per_pass):
    """flow_helper's ``get_online_pass_interval`` (data not hourly placed): each pass's
    folder names, ``HHMM`` every ``split_interval`` minutes, ``split_per_pass`` a pass."""
    split_interval, split_per_pass = int(split_interval), int(split_per_pass)
    splits = [f"{m // 60:02d}{m % 60:02d}" for m in range(0, 24 * 60, split_interval)]
    passes = len(splits) // split_per_pass
    return [splits[i * split_per_pass : (i + 1) * split_per_pass] for i in range(passes)]


def get_next_day(day):
    return (datetime.datetime.strptime(str(day), "%Y%m%d") + datetime.timedelta(days=1)).strftime(
        "%Y%m%d"
    )


def pipe_command(config):
    """``"{pipe_command} {yaml_path} {utils_path}"``, a leading ``python3.N`` as ``python``."""
    command = re.sub(r"^python3(\.\d+)?\b", "python", config.get("runner.pipe_command").strip())
    return "{} {} {}".format(command, config.get("yaml_path"), UTILS)


def pass_files(config, day, folders):
    """Every file of the pass's folders (``file_ls``), all workers' (the dataset splits)."""
    train_data_path = config.get("runner.train_data_dir")
    files = []
    for name in folders:
        path = os.path.join(train_data_path, str(day), str(name))
        if not os.path.isdir(path):
            raise SystemExit(f"day {day}: no data folder {path} (runner.train_data_dir/DAY/HHMM)")
        files += [os.path.join(path, f) for f in sorted(os.listdir(path))]
    return files


def make_dataset(config, schema, files, *, infer=False):
    """``paddle.base.DatasetFactory().create_dataset(reader_type)`` over ``files``; each
    worker reads its share (``fleet.util.get_file_shard``)."""
    batch = config.get("runner.infer_batch_size" if infer else "runner.train_batch_size", 1)
    threads = config.get("runner.infer_thread_num" if infer else "runner.train_thread_num", 12)
    if infer:  # wait_and_prepare_infer_dataset: a dataset read once
        kind = QueueDataset
    elif config.get("runner.reader_type", "InMemoryDataset") == "InMemoryDataset":
        kind = InMemoryDataset
    else:
        kind = QueueDataset
    return kind(files, schema, int(batch), threads=int(threads),
                pipe_command=pipe_command(config), format="multislot")  # fmt: skip


def save_inference(trainer, save_model_path, day):
    """``save_inference_model(output_path, day, pass_id, ...)``: the next save of the day's
    chain (``DAY/delta-PASS`` in Paddle), its base if the day has none yet (``DAY/base``)."""
    folder = os.path.join(save_model_path, str(day))
    has_base = os.path.isdir(folder) and any(n.startswith("base-") for n in os.listdir(folder))
    return trainer.save_inference_model(folder, mode="delta" if has_base else "base")


def run_online_worker(trainer, schema, config):
    intervals = get_online_pass_interval(config.get("runner.split_interval", 5),
                                         config.get("runner.split_per_pass", 1))  # fmt: skip
    checkpoint_per_pass = int(config.get("runner.checkpoint_per_pass", 6))
    save_delta_frequency = int(config.get("runner.save_delta_frequency", 6))
    save_model_path = config.get("runner.model_save_path")
    prefetch = config.get("runner.prefetch", False)
    summary = {"passes": []}
    day, end_day = str(config.get("runner.start_day")), str(config.get("runner.end_day"))
    next_dataset = None
    while int(day) <= int(end_day):
        log.info("training a new day %s, end_day = %s", day, end_day)
        for pass_id in range(1, 1 + len(intervals)):
            # dataset = next_dataset or self.wait_and_prepare_dataset(day, pass_id)
            dataset, next_dataset = next_dataset, None
            if dataset is None:
                dataset = make_dataset(
                    config, schema, pass_files(config, day, intervals[pass_id - 1])
                )
                dataset.load_into_memory()
            else:  # dataset.wait_preload_done()
                dataset.wait_preload_done()
            # dataset.global_shuffle(fleet, shuffle_thread_num)
            if isinstance(dataset, InMemoryDataset):
                dataset.global_shuffle(seed=pass_id)
            # if prefetch: next_dataset = self.prefetch_next_dataset(day, pass_id)
            if prefetch:
                next_dataset = _prefetch(config, schema, day, pass_id, intervals, end_day)
            # self.dataset_infer_loop(dataset, day, pass_id): the pass's data, before training
            before = trainer.evaluate(dataset)
            log.info("Day:%s, Pass: %d, Infer Global Metric: %s", day, pass_id, before)
            # self.dataset_train_loop(dataset, day, pass_id, self.need_train_dump)
            result = trainer.train_from_dataset(
                dataset, print_period=int(config.get("runner.print_interval", 1))
            )
            log.info("Day:%s, Pass: %d, Train Global Metric: %s", day, pass_id, result.metrics)
            # dataset.release_memory()
            if isinstance(dataset, InMemoryDataset):
                dataset.release_memory()
            entry = {"day": day, "pass": pass_id, "infer_auc": before.auc,
                     "train_auc": result.metrics.auc, "samples": result.metrics.count}  # fmt: skip
            # if self.need_infer_dump: self.dataset_infer_loop(dump_dataset, day, pass_id, True)
            if config.get("runner.need_infer_dump", False):
                dump = make_dataset(config, schema, pass_files(config, day, intervals[pass_id - 1]),
                                    infer=True)  # fmt: skip
                where = os.path.join(config.get("runner.infer_dump_fields_dir"), day, str(pass_id))
                trainer.predict_from_dataset(dump, where)
                entry["infer_dump"] = where
            # if pass_id % checkpoint_per_pass == 0 and pass_id != len(intervals):
            #     save_model(self.exe, self.save_model_path, day, pass_id)
            if pass_id % checkpoint_per_pass == 0 and pass_id != len(intervals):
                trainer.save_checkpoint(os.path.join(save_model_path, day, str(pass_id)))
            # if pass_id % self.save_delta_frequency == 0: save_inference_model(..., day, pass_id)
            if pass_id % save_delta_frequency == 0:
                entry["inference"] = str(save_inference(trainer, save_model_path, day))
            summary["passes"].append(entry)
        # fleet.shrink(): Paddle's accessor decays show/click (show_click_decay_rate) and
        # deletes rows (delete_threshold, delete_after_unseen_days) in one call
        trainer.decay()
        deleted = trainer.shrink()
        log.info("shrink table done: %s rows deleted", deleted)
        # next_day = get_next_day(day)
        # save_inference_model(self.save_model_path, next_day, -1, ...)   (the base)
        next_day = get_next_day(day)
        base = trainer.save_inference_model(os.path.join(save_model_path, next_day), mode="base")
        # save_batch_model(self.exe, self.save_model_path, next_day)   (DAY/0)
        trainer.save_checkpoint(os.path.join(save_model_path, next_day, "0"))
        summary.setdefault("days", []).append(
            {"day": day, "shrink_deleted": deleted, "base": str(base)}
        )
        day = next_day
    return summary


def _prefetch(config, schema, day, pass_id, intervals, end_day):
    """``prefetch_next_dataset``: the next pass's dataset, loading in the background
    (None past ``end_day`` or when its folders are not there yet)."""
    next_day, folders = (day, intervals[pass_id]) if pass_id < len(intervals) else (
        get_next_day(day), intervals[0])  # fmt: skip
    root = config.get("runner.train_data_dir")
    if int(next_day) > int(end_day) or not all(
        os.path.isdir(os.path.join(root, next_day, f)) for f in folders
    ):
        return None
    dataset = make_dataset(config, schema, pass_files(config, next_day, folders))
    dataset.preload_into_memory()
    return dataset


def main(argv=None) -> int:
    config = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(message)s", level=logging.INFO)
    # get_model(config): the model's folder (next to the config) and utils/static_ps
    sys.path[:0] = [config["config_abs_dir"], UTILS]
    from static_model import StaticModel

    # self.init_fleet_with_gloo(): fleet.init(role)
    sps.init()
    # if fleet.is_server(): self.run_server()  (init_server, run_server)
    if sps.is_server():
        sps.run_server()
        return 0
    # self.init_network(): model = get_model(self.config); self.input_data = model.create_feeds()
    torch.manual_seed(0)
    model = StaticModel(config)
    schema = model.create_feeds()
    # self.metrics = model.net(self.input_data); model.create_optimizer(get_strategy(config))
    trainer = sps.Trainer(model.net(schema), dense_optimizer=model.create_optimizer(),
                          strategy=get_strategy(config))  # fmt: skip
    # self.run_online_worker(); fleet.stop_worker()
    summary = run_online_worker(trainer, schema, config)
    rank = sps.worker_index()
    trainer.stop()
    sps.stop()
    if rank == 0:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
