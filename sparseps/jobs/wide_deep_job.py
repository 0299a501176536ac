"""The job behind ``sparseps demo`` and ``sparseps bench e2e``: wide&deep on Criteo TSV.

Run by the launcher on every role (``sparseps launch ... wide_deep_job.py --train ...``):
servers serve; workers train one or more passes on their share of the train files,
evaluate global metrics on the test files, and worker 0 writes a JSON result.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

import sparseps as sps
from sparseps.data import CRITEO, InMemoryDataset, QueueDataset
from sparseps.jobs.rule_spec import parse_rule


def _mode(args: argparse.Namespace):
    """The mode the flags describe; ``async`` in a job launched with heter workers is
    their mode (Heter), with the same push merging."""
    merge = {"push_merge": args.push_merge, "push_merge_window": args.push_merge_window}
    if args.mode == "async":
        from sparseps.role import role_env

        env = role_env()
        if env is not None and env.heter_workers:
            gather = (
                {} if args.heter_gather_rows is None else {"gather_rows": args.heter_gather_rows}
            )
            return sps.Heter(**merge, **gather)
        return sps.Async(**merge)
    if args.mode == "hybrid":
        return sps.Hybrid(**merge)
    if args.mode == "gpups":
        return sps.GpuPS(device=args.device)
    return args.mode


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--train", required=True, help="train file or folder (Criteo TSV)")
    p.add_argument("--test", required=True, help="test file or folder (Criteo TSV)")
    p.add_argument("--result", required=True, help="JSON result written by worker 0")
    p.add_argument("--mode", default="async", choices=["sync", "async", "geo", "gpups", "hybrid"])
    p.add_argument(
        "--push-merge", default=None, choices=["off", "on", "auto"],
        help="async/hybrid: merge sparse pushes over a window of steps (Async.push_merge; "
        "default: the mode's)",
    )  # fmt: skip
    p.add_argument("--push-merge-window", type=int, default=8, help="Async.push_merge_window")
    p.add_argument("--device", default="auto", help="gpups mode: cuda, cpu or auto (GpuPS.device)")
    p.add_argument(
        "--heter-gather-rows", type=int, default=None,
        help="with heter workers: Heter.gather_rows (0: no request gathering; default: the mode's)",
    )  # fmt: skip
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "--torch-threads", type=int, default=1,
        help="torch compute threads per worker (1: workers and servers share the cores; "
        "GPUPS on CPU runs one worker per machine over its cores)",
    )  # fmt: skip
    p.add_argument(
        "--passes", type=int, default=1,
        help="gpups: cut the train files into this many passes, each prepared (keys, rows) "
        "while the one before trains (the GPUPS pipeline)",
    )  # fmt: skip
    p.add_argument("--emb-dim", type=int, default=8)
    p.add_argument("--hidden", default="400,400,400")
    p.add_argument("--lr", type=float, default=0.0003, help="dense Adam learning rate")
    p.add_argument(
        "--sparse-lr", type=float, default=0.01, help="deep table Adam learning rate (eps 1e-4)"
    )
    p.add_argument("--dense-rule", default="", help="dense rule spec (default: adam:lr=LR)")
    p.add_argument(
        "--deep-rule", default="", help="deep table rule spec, e.g. adam:lr=0.01 (default: "
        "Adam(--sparse-lr))",
    )  # fmt: skip
    p.add_argument("--wide-rule", default="", help="wide table rule spec (default: WideDeep's)")
    p.add_argument(
        "--bias-init", default="prior", choices=["prior", "zero"],
        help="output bias: logit of the click rate of the first --prior-rows train rows "
        "(all workers together) or PyTorch's default (zero)",
    )  # fmt: skip
    p.add_argument(
        "--prior-rows", type=int, default=20000, help="rows read per worker for the prior"
    )
    p.add_argument(
        "--calibrate-rows", type=int, default=150000,
        help="after the last pass, shift the logit so that the final model's predicted "
        "clicks equal the clicks of N training rows per worker (whole batches drawn over "
        "the pass); 0: off",
    )  # fmt: skip
    p.add_argument("--admit-count", type=int, default=1, help="shows before a key gets a row")
    p.add_argument(
        "--memory-rows", type=int, default=0,
        help="rows of each table a server keeps in memory, the rest in its disk dir "
        "(SPARSEPS_DISK_DIR / --disk-dir of sparseps demo); 0: every row in memory",
    )  # fmt: skip
    p.add_argument("--cvm", action="store_true", help="slots' show/click features (cvm op)")
    p.add_argument(
        "--mlp-init", default="torch", choices=["torch", "glorot"],
        help="the dense layers' initialisation (sparseps.models.WideDeep's mlp_init)",
    )  # fmt: skip
    p.add_argument(
        "--emb-init", type=float, default=0.05,
        help="deep rows start uniform in [-X, X] (sparseps.models.WideDeep's emb_init)",
    )  # fmt: skip
    p.add_argument(
        "--embedx-threshold", type=float, default=None,
        help="one CTR-accessor table: a feature's embedx part is stored once its show/click "
        "score reaches this (docs/table.md, 'Accessor'); default: today's two tables",
    )  # fmt: skip
    p.add_argument("--embedx-dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--threads", type=int, default=1, help="reader threads per worker")
    p.add_argument("--no-prefetch", action="store_true", help="turn off pull/compute overlap")
    p.add_argument("--print-period", type=int, default=200)
    p.add_argument(
        "--hold-file", default="",
        help="drills: after each batch, wait while this file exists (at most 300 s), e.g. "
        "while a replacement server copies its shards",
    )  # fmt: skip
    p.add_argument("--checkpoint", default="", help="save a checkpoint here after training")
    p.add_argument("--inference-model", default="", help="save an inference model here")
    return p.parse_args(argv)


def _held(hold: Path, then):
    """An ``on_batch`` that waits while ``hold`` exists (bounded), then calls ``then``."""

    def on_batch(step, stats) -> None:
        deadline = time.monotonic() + 300
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if then is not None:
            then(step, stats)

    return on_batch


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    # the worker's modules, torch among them, only here: a server is forked from a
    # launcher's fork server that holds none of them, and importing them cost each
    # server ~1.4 CPU-s and delayed its start (so every worker's) by seconds under load
    import torch

    from sparseps.core import collectives
    from sparseps.models import WideDeep
    from sparseps.models._blocks import set_output_bias
    from sparseps.models.calibration import ProgressiveCalibrator
    from sparseps.worker.gpups import resolve_device

    torch.set_num_threads(args.torch_threads)  # workers and servers share the cores
    torch.manual_seed(0)
    lifecycle = None
    if args.admit_count > 1:
        lifecycle = sps.Lifecycle(admission="count", admit_count=args.admit_count)
    model = WideDeep(
        CRITEO.slots,
        len(CRITEO.dense),
        emb_dim=args.emb_dim,
        hidden=[int(h) for h in args.hidden.split(",") if h],
        deep_rule=parse_rule(args.deep_rule)
        if args.deep_rule
        else sps.optim.Adam(lr=args.sparse_lr, eps=1e-4),
        wide_rule=parse_rule(args.wide_rule) if args.wide_rule else None,
        lifecycle=lifecycle,
        memory_rows=args.memory_rows or None,
        cvm=args.cvm,
        embedx_threshold=args.embedx_threshold,
        embedx_dtype=args.embedx_dtype,
        mlp_init=args.mlp_init,
        emb_init=args.emb_init,
    )
    # the Trainer first: in a heter worker it serves the dense network from here on (the
    # dense values come from the servers' table, which worker 0 creates after the prior)
    trainer = sps.Trainer(
        model,
        dense_optimizer=parse_rule(args.dense_rule)
        if args.dense_rule
        else sps.optim.Adam(lr=args.lr),
        strategy=sps.Strategy(mode=_mode(args), prefetch=not args.no_prefetch),
        num_threads=args.torch_threads,
    )
    prior = None
    if args.bias_init == "prior":
        prior = _click_rate(args.train, args.prior_rows)
        set_output_bias(model, prior)
    train, gpups = _train_data(args)
    start = time.perf_counter()
    samples, build_s = 0, []
    calibrator = ProgressiveCalibrator(args.calibrate_rows) if args.calibrate_rows > 0 else None
    on_batch = _held(Path(args.hold_file), calibrator) if args.hold_file else calibrator
    order = [data for _ in range(args.epochs) for data in train]  # every pass, in order
    for i, data in enumerate(order):
        result = trainer.train_from_dataset(
            data, print_period=args.print_period, on_batch=on_batch,
            next_dataset=order[i + 1] if i + 1 < len(order) and args.mode == "gpups" else None,
        )  # fmt: skip
        samples += result.samples
        build_s.append(result.timings.get("build_s"))
    train_s = time.perf_counter() - start
    shift = 0.0
    if calibrator is not None:  # every worker computes the same shift (collective)
        shift = calibrator.refit(trainer)
        model.head.get_buffer("logit_shift").fill_(shift)
    calibrate_s = time.perf_counter() - start - train_s
    total = collectives.all_reduce_sum(np.array([samples], np.int64))[0]
    test = QueueDataset([args.test], CRITEO, batch_size=4096, threads=args.threads)
    metrics = trainer.evaluate(test)
    stats = trainer.client.stats()
    summary = {
        "rows": int(total),
        "train_s": round(train_s, 3),
        "samples_per_s": round(float(total) / train_s, 1),
        "test_auc": metrics.auc,
        "test_logloss": metrics.logloss,
        "test_copc": metrics.copc,
        "test_actual_ctr": metrics.actual_ctr,
        "test_predicted_ctr": metrics.predicted_ctr,
        "prior_click_rate": prior,
        "logit_shift": shift,
        "calibrate_s": round(calibrate_s, 3),
        "test_rows": metrics.count,
        "train_auc": result.metrics.auc,
        "mode": args.mode,
        "worker0_batches": result.batches,
        "worker0_pass_s": round(result.seconds, 3),
        "worker0_timings": result.timings,
        "workers": sps.worker_num(),
        "table_rows": _table_rows(stats, trainer.tables),
        "table_bytes": _table_bytes(stats, trainer.tables),
        **_tier_figures(stats),
        **gpups,
    }
    if args.mode == "gpups":
        device = resolve_device(args.device, sps.worker_index())
        summary.update(device=str(device), build_s=build_s)
    if args.checkpoint:
        trainer.save_checkpoint(args.checkpoint)
        summary["checkpoint"] = args.checkpoint
    if args.inference_model:
        trainer.save_inference_model(args.inference_model)
        summary["inference_model"] = args.inference_model
    if sps.worker_index() == 0:
        Path(args.result).write_text(json.dumps(summary, indent=2))
    trainer.stop()
    sps.stop()
    return 0


def _train_data(args) -> tuple:
    """The train passes: one streamed dataset, or for gpups ``--passes`` in-memory datasets
    (a pass needs its keys up front) over consecutive groups of the train files; and for
    gpups ``{"load_s": seconds (not part of train_s), "passes": how many}``."""
    if args.mode != "gpups":
        return [
            QueueDataset([args.train], CRITEO, batch_size=args.batch_size, threads=args.threads)
        ], {}
    start = time.perf_counter()
    folder = Path(args.train)
    files = sorted(str(f) for f in folder.iterdir()) if folder.is_dir() else [args.train]
    passes = []
    for group in np.array_split(np.array(files), max(1, min(args.passes, len(files)))):
        data = InMemoryDataset(list(group), CRITEO, batch_size=args.batch_size,
                               threads=args.threads)  # fmt: skip
        data.load_into_memory()
        passes.append(data)
    return passes, {"load_s": round(time.perf_counter() - start, 3), "passes": len(passes)}


def _click_rate(train: str, rows: int) -> float:
    """Clicks / rows over the first ``rows`` train rows of every worker's share (all
    workers agree, so they start from the same dense parameters)."""
    first = next(iter(QueueDataset([train], CRITEO, batch_size=max(rows, 1))), None)
    local = (0.0, 0.0) if first is None else (float(first.label.sum()), float(len(first)))
    from sparseps.core import collectives  # a worker's module (main's note)

    clicks, count = collectives.all_reduce_sum(np.array(local, np.float64))
    return float(clicks / count) if count else 0.5


def _tier_figures(stats: dict) -> dict:
    """Rows in memory and on disk (all tables, all servers) and the largest server's
    peak resident memory, from the client's stats."""
    tables = stats["total"]["tables"].values()
    return {
        "memory_rows": sum(int(t["memory_rows"]) for t in tables),
        "disk_rows": sum(int(t["disk_rows"]) for t in tables),
        "server_peak_rss_bytes": max(
            (int(s.get("peak_rss_bytes", 0)) for s in stats["servers"]), default=0
        ),
    }


def _table_bytes(stats: dict, tables) -> dict:
    """Per table, summed over servers (each shard once: its primary's figures): live
    ``rows``, ``embedx_rows`` (rows with an embedx part) and ``bytes`` of server memory."""
    out = {name: {"rows": 0, "embedx_rows": 0, "bytes": 0} for name in tables}
    for server in stats["servers"]:
        for name, table in server.get("tables", {}).items():
            if name in out:
                out[name]["rows"] += int(table.get("rows", 0))
                out[name]["embedx_rows"] += int(table.get("embedx_rows", table.get("rows", 0)))
                out[name]["bytes"] += int(table.get("bytes_used", 0))
    return out


def _table_rows(stats: dict, tables) -> dict:
    """Rows per table summed over servers (the client's stats totals)."""
    totals = stats["total"]["tables"]
    return {name: int(totals.get(name, {}).get("rows", 0)) for name in tables}


if __name__ == "__main__":
    sys.exit(main())
