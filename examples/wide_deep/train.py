"""The seed system's wide&deep quick start, in sparseps.

usage: train.py [-h] [--data-dir DIR] [--rows N] [--train PATH] [--test PATH]
                [--mode {sync,async,geo}] [--passes N] [--batch-size N] [--emb-dim N]
                [--hidden 400,400,400] [--print-period N] [--metrics-path FILE]

    sparseps launch --server-num 1 --worker-num 2 examples/wide_deep/train.py
    python examples/wide_deep/train.py                     # local mode: no launcher
    sparseps launch --server-num 1 --worker-num 2 examples/wide_deep/train.py \\
        --train data/train --test data/test                # your own Criteo TSV files

The same script runs on every role: servers serve, workers train on their share of the
training files and worker 0 prints the global test metrics (``test auc: ...``). Without
--train/--test it trains on a synthetic Criteo-format data set in --data-dir, which
worker 0 generates first (``sparseps gen-data``'s planted model) if it is not there.
"""

import argparse
import json
from pathlib import Path

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.models import WideDeep


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="wide&deep on Criteo-format data (sparseps quick start)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--data-dir",
        default="out/wide_deep_data",
        help="synthetic data folder (made by worker 0 when missing)",
    )
    p.add_argument("--rows", type=int, default=100_000, help="training rows to generate")
    p.add_argument("--train", help="Criteo TSV file or folder (default: DATA_DIR/train)")
    p.add_argument("--test", help="Criteo TSV file or folder (default: DATA_DIR/test)")
    p.add_argument("--mode", choices=("sync", "async", "geo"), default="async")
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--emb-dim", type=int, default=8)
    p.add_argument("--hidden", default="400,400,400", help="MLP widths, comma-separated")
    p.add_argument("--print-period", type=int, default=100, help="batches between progress lines")
    p.add_argument("--metrics-path", help="worker 0 appends one JSON line per pass here")
    args = p.parse_args()
    if (args.train is None) != (args.test is None):
        p.error("give both --train and --test, or neither (then --data-dir is used)")
    return args


def ensure_data(args: argparse.Namespace) -> tuple[str, str]:
    """The train/test paths; worker 0 writes the synthetic set once, the others wait."""
    if args.train:
        return args.train, args.test
    folder = Path(args.data_dir)
    meta = folder / "meta.json"  # written last: its presence means the set is complete
    if sps.worker_index() == 0 and not meta.exists():
        from sparseps.data.synthetic import write_dataset

        info = write_dataset(folder, rows=args.rows, seed=7, files=4)
        print(f"wrote {info['rows']} train / {info['test_rows']} test rows to {folder} "
              f"(planted model's test auc: {info['bayes_auc_test']:.4f})")  # fmt: skip
    sps.barrier_worker()
    if not meta.exists():
        raise SystemExit(f"train.py: {meta} is missing (worker 0 did not finish writing it)")
    return str(folder / "train"), str(folder / "test")


def main() -> None:
    args = parse_args()
    sps.init()
    if sps.is_server():  # a server holds the tables the workers create; no model needed
        sps.run_server()
        return
    hidden = tuple(int(h) for h in args.hidden.split(",") if h)
    model = WideDeep(CRITEO.slots, num_dense=len(CRITEO.dense), emb_dim=args.emb_dim,
                     hidden=hidden)  # fmt: skip
    trainer = sps.Trainer(
        model,
        dense_optimizer=sps.optim.Adam(lr=0.001),
        strategy=sps.Strategy(mode=args.mode),
        report=sps.metrics.ReportConfig(metrics_path=args.metrics_path),
    )
    train_path, test_path = ensure_data(args)
    train = QueueDataset([train_path], schema=CRITEO, batch_size=args.batch_size, threads=1)
    for _ in range(args.passes):
        trainer.train_from_dataset(train, print_period=args.print_period)
    metrics = trainer.evaluate(QueueDataset([test_path], schema=CRITEO, batch_size=4096))
    if sps.worker_index() == 0:
        print(f"test auc: {metrics.auc:.4f}  logloss: {metrics.logloss:.4f}  rows: {metrics.count}")
        print(json.dumps({"test_auc": metrics.auc, "test_logloss": metrics.logloss,
                          "rows": metrics.count}))  # fmt: skip
    trainer.stop()
    sps.stop()


if __name__ == "__main__":
    main()
