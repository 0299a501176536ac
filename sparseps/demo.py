"""``sparseps demo``: the main job on its embedded default (DESIGN §2.1).

Makes (or reuses) a synthetic Criteo-format data set from a planted model, launches
1 server + 2 workers on this machine, trains wide&deep for one pass, evaluates global
test AUC and logloss, saves a checkpoint and an inference model when the model-file
support is present, and prints one summary (with ``--json``: the last stdout line is a
JSON object).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .errors import SparsePSError

DEFAULT_ROWS = 2_000_000
DEFAULT_SEED = 2026


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="synthetic train rows")
    parser.add_argument(
        "--train", help="Criteo TSV file or folder to train on (instead of synthetic)"
    )
    parser.add_argument("--test", help="Criteo TSV file or folder to test on (with --train)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON last")
    parser.add_argument("--mode", default="async", choices=["sync", "async", "geo"])
    parser.add_argument("--server-num", type=int, default=1)
    parser.add_argument("--worker-num", type=int, default=2)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="synthetic data seed")
    parser.add_argument(
        "--memory-rows", type=int, default=0,
        help="rows of each table a server keeps in memory, the rest on disk (docs/table.md); "
        "0: every row in memory",
    )  # fmt: skip
    parser.add_argument(
        "--disk-dir", help="the servers' folder for rows beyond --memory-rows (default OUT/disk)"
    )


def _data(args, out: Path) -> tuple[str, str, float | None]:
    if args.train or args.test:
        if not (args.train and args.test):
            raise SparsePSError("sparseps demo: give both --train and --test, or neither")
        return args.train, args.test, None
    from .data.synthetic import write_dataset

    folder = out / "data"
    meta_path = folder / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("rows") == args.rows and meta.get("seed") == args.seed:
            return str(folder / "train"), str(folder / "test"), meta.get("bayes_auc_test")
    meta = write_dataset(folder, rows=args.rows, seed=args.seed, files=4)
    return str(folder / "train"), str(folder / "test"), meta.get("bayes_auc_test")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train, test, bayes_auc = _data(args, out)
    result_path = out / "result.json"
    result_path.unlink(missing_ok=True)
    job = Path(__file__).resolve().parent / "jobs" / "wide_deep_job.py"
    command = [
        sys.executable, "-m", "sparseps.cli", "launch",
        "--server-num", str(args.server_num), "--worker-num", str(args.worker_num),
        "--log-dir", str(out / "log"), str(job),
        "--train", train, "--test", test, "--result", str(result_path), "--mode", args.mode,
        "--checkpoint", str(out / "checkpoint"), "--inference-model", str(out / "inference_model"),
    ]  # fmt: skip
    env = dict(os.environ)
    if args.memory_rows < 0:
        raise SparsePSError(f"sparseps demo: --memory-rows must be >= 0, got {args.memory_rows}")
    if args.memory_rows > 0:  # servers read their disk dir from the environment
        command += ["--memory-rows", str(args.memory_rows)]
        env["SPARSEPS_DISK_DIR"] = str(Path(args.disk_dir or out / "disk").resolve())
    elif args.disk_dir:
        raise SparsePSError("sparseps demo: --disk-dir needs --memory-rows N (N > 0)")
    start = time.perf_counter()
    code = subprocess.call(command, env=env)
    if code != 0 or not result_path.is_file():
        raise SparsePSError(
            f"the demo job failed (exit code {code}); see the logs in {out / 'log'}"
        )
    summary = json.loads(result_path.read_text())
    summary.update(
        wall_s=round(time.perf_counter() - start, 1),
        bayes_auc=bayes_auc,
        test_data=test,
        train_data=train,
        checkpoint=summary.get("checkpoint"),
        inference_model=summary.get("inference_model"),
    )
    gap = "" if bayes_auc is None else f" (planted model: {bayes_auc:.4f})"
    print(
        f"sparseps demo: {summary['rows']} rows in {summary['train_s']:.1f} s "
        f"({summary['samples_per_s']:.0f} samples/s), test AUC {summary['test_auc']:.4f}{gap}, "
        f"logloss {summary['test_logloss']:.4f}, table rows {summary['table_rows']}"
    )
    if args.json:
        print(json.dumps(summary))
    return 0
