"""A small training job for the worker tests (run by ``sparseps launch`` on every role).

Trains WideDeep (tiny MLP) for --passes passes over the train files in --mode, then worker
0 pulls the rows of the keys in --keys and writes them with the dense vector to --out.
"""

import argparse
import json
import sys

import numpy as np

import sparseps as sps

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--test", default="")
p.add_argument("--keys", required=True)
p.add_argument("--out", required=True)
p.add_argument("--mode", default="sync")
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--hold-file", default="", help="after each batch, wait while it exists")
p.add_argument("--passes", type=int, default=1)
p.add_argument("--k-steps", type=int, default=5)
p.add_argument("--push-merge", default=None)
p.add_argument("--push-merge-window", type=int, default=8)
p.add_argument("--dense-out", default="", help="every worker: its dense vector, DIR/RANK.npy")
p.add_argument("--load", default="")
p.add_argument("--save", default="")
p.add_argument("--infer-check", action="store_true")
p.add_argument("--metrics-path", default=None)
p.add_argument("--dump", default="")
p.add_argument("--save-stalled", default="", help="then start this save and stall after one table")
p.add_argument("--marker", default="", help="touched when the stalled save is stalled")
p.add_argument(
    "--predict-check", default="", help="inference dir: base, shrink, 2 deltas vs Predictor"
)
p.add_argument("--shrink-score", type=float, default=0.0)
args = p.parse_args()

sps.init()
if sps.is_server():
    # Servers take their tables from the workers' create_table: they never import torch
    # (its import was ~3 s of CPU per server on 2 cores). Building the model before this
    # check is covered by straggler_job.py and examples/wide_deep/train.py.
    sps.run_server()
    sys.exit(0)

import torch  # noqa: E402

from sparseps.data import CRITEO, QueueDataset  # noqa: E402
from sparseps.models import WideDeep  # noqa: E402
from sparseps.worker.dense_params import DenseParams  # noqa: E402

torch.manual_seed(0)
model = WideDeep(
    CRITEO.slots,
    len(CRITEO.dense),
    emb_dim=4,
    hidden=(16,),
    deep_rule=sps.optim.SGD(lr=0.05),
    wide_rule=sps.optim.Adagrad(lr=0.05),
    lifecycle=sps.Lifecycle(shrink_score=args.shrink_score),
)
merge = {"push_merge": args.push_merge, "push_merge_window": args.push_merge_window}
# "async" with default knobs: the job's default mode (Heter() when it has heter workers)
modes = {"geo": sps.Geo(k_steps=args.k_steps), "hybrid": sps.Hybrid(**merge),
         "async": sps.Async(**merge) if args.push_merge else None,
         "heter_sync": sps.Heter(sync=True)}  # fmt: skip
strategy = sps.Strategy(mode=modes.get(args.mode, args.mode))
dump = (
    sps.metrics.DumpConfig(
        args.dump, fields=("sample_id", "label", "pred", "C1"), params=("head.wide_dense.weight",)
    )
    if args.dump
    else None
)
trainer = sps.Trainer(
    model,
    dense_optimizer=sps.optim.Adam(lr=0.01),
    strategy=strategy,
    report=sps.metrics.ReportConfig(metrics_path=args.metrics_path, dump=dump),
)

if args.load:
    trainer.load_checkpoint(args.load)
train = QueueDataset([args.train], CRITEO, batch_size=args.batch_size, threads=1)
results, timings = [], {}


def held(step, stats) -> None:
    """--hold-file drills: after each batch, FILE.seen exists and the worker waits while
    FILE does (at most 300 s)."""
    if not args.hold_file:
        return
    import pathlib
    import time

    hold = pathlib.Path(args.hold_file)
    hold.with_suffix(".seen").touch()
    deadline = time.monotonic() + 300
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


for _ in range(args.passes):
    result = trainer.train_from_dataset(train, print_period=0, on_batch=held)
    results.append(result.metrics.auc)
    timings = result.timings
if args.save:
    trainer.save_checkpoint(args.save)
summary = {"train_auc": results, "timings": timings}
push_queue = getattr(trainer.state.mode, "queue", None)  # async and hybrid modes
if push_queue is not None:
    summary["push_rows"] = [push_queue.stats().held_rows, push_queue.stats().sent_rows]
if args.save_stalled:
    import pathlib
    import time

    from sparseps.checkpoint.hooks import SaveHooks

    class Stall(SaveHooks):
        def after_table_saved(self, table):
            pathlib.Path(args.marker).touch()
            time.sleep(120)  # the test kills a server now; the save must not complete

    trainer.save_checkpoint(args.save_stalled, hooks=Stall())
if args.predict_check:
    from sparseps.checkpoint.predictor import Predictor

    test = QueueDataset([args.test], CRITEO, batch_size=64, threads=1)
    diffs, deleted = [], {}
    for step in range(3):
        if step:
            trainer.train_from_dataset(train, print_period=0)
            deleted = trainer.shrink()
        trainer.save_inference_model(args.predict_check, mode="delta" if step else "base")
        ours = trainer.infer_from_dataset(test).predictions
        theirs = Predictor(args.predict_check).predict(test)
        diffs.append(float(np.abs(ours - theirs).max()))
    summary["predict_diffs"] = diffs
    summary["deleted"] = deleted
keys = np.load(args.keys)
before = {t: trainer.client.pull(t, keys).wait() for t in trainer.tables}


def table_stats():
    return json.dumps([s["tables"] for s in trainer.client.stats()["servers"]], sort_keys=True)


def snapshot(folder):
    """Every byte the servers hold for the model: each table saved (every column: keys,
    embeddings, optimizer state, show/click/unseen/delta_score, pending counters) with
    the files' sha256, and the async dense table."""
    records = {t: trainer.client.save(t, folder) for t in trainer.tables}
    files = {r["name"]: r["sha256"] for parts in records.values() for r in parts}
    columns = {}
    for parts in records.values():
        for r in parts:
            _, cols = read_shard(r["path"])
            order = np.argsort(cols["key"], kind="stable")  # compare by key, not file order
            columns.update({f"{r['name']}:{c}": v[order] for c, v in cols.items()})
    dense = trainer.client.pull_dense(DENSE_TABLE).wait() if args.mode == "async" else None
    return files, columns, dense


if args.infer_check:
    import pathlib

    from sparseps.core import collectives
    from sparseps.files.shards import read_shard
    from sparseps.worker.modes import DENSE_TABLE

    rank = sps.worker_index()
    check_dir = pathlib.Path(args.out).parent / "infer-check"
    collectives.barrier()  # every worker's pass is done before anybody snapshots
    files_before, columns_before, dense_before = snapshot(check_dir / f"before-{rank}")
    stats_before = table_stats()
    collectives.barrier()  # nobody infers while another worker still snapshots
if args.test:
    test = QueueDataset([args.test], CRITEO, batch_size=64, threads=1)
    summary["test_auc"] = trainer.evaluate(test).auc  # a collective: all workers are done
if args.infer_check:
    files_after, columns_after, dense_after = snapshot(check_dir / f"after-{rank}")
    stats_after = table_stats()
    same = (
        files_before == files_after
        and columns_before.keys() == columns_after.keys()
        and all(np.array_equal(v, columns_after[k]) for k, v in columns_before.items())
        and (dense_before is None or dense_before.tobytes() == dense_after.tobytes())
    )
    checked = (len(files_before), sum(v.size for v in columns_before.values()))
    # every worker's verdict, gathered so worker 0 reports them all
    verdicts = collectives.all_gather_arrays(np.array([int(same), *checked], np.int64))
    summary["infer_unchanged"] = [bool(v[0]) for v in verdicts]
    summary["infer_checked"] = [v[1:].tolist() for v in verdicts]
    summary["dense_checked"] = dense_before is not None and dense_before.size > 0
    summary["stats_unchanged"] = stats_before == stats_after
    summary["stats"] = stats_after
    collectives.barrier()
    if rank == 0:  # the comparison's own check: one more show on one key must be seen
        table = sorted(trainer.tables)[0]
        key = keys[:1]  # a trained key: its row exists
        zeros = np.zeros((1, trainer.tables[table].dim), np.float32)
        trainer.client.push(table, key, zeros, shows=np.ones(1, np.float32)).wait()
        files_changed, columns_changed, _ = snapshot(check_dir / "changed")
        summary["change_detected"] = files_changed != files_after and any(
            not np.array_equal(v, columns_after[k]) for k, v in columns_changed.items()
        )
if args.dense_out:
    import pathlib

    pathlib.Path(args.dense_out).mkdir(parents=True, exist_ok=True)
    np.save(f"{args.dense_out}/{sps.worker_index()}.npy", DenseParams(model).values())
if sps.worker_index() == 0:
    arrays = {f"table.{t}": v for t, v in before.items()}
    arrays["dense"] = DenseParams(model).values()
    np.savez(args.out, **arrays)
    with open(args.out + ".json", "w") as f:
        json.dump(summary, f)
trainer.stop()
sps.stop()
