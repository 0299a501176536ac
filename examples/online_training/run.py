"""Streaming training on a drifting synthetic stream, against a model frozen after day 1.

1. writes DAYS days of 5-minute splits (``OUT/data/YYYYMMDD/HHMM/part-00000.tsv`` +
   ``_SUCCESS``) from a planted model whose weights rotate ``--drift`` radians per day;
2. ``sparseps online OUT/online.yaml``: 1 server + 2 workers, sync mode, passes of 2
   splits, progressive AUC, a delta inference model per pass, base + checkpoint per day;
3. ``sparseps online OUT/frozen.yaml``: the day-1 checkpoint, evaluate-only on days 2..;
4. prints progressive AUC per day of both, and the planted (Bayes) AUC.

Usage: ``python examples/online_training/run.py --out /tmp/online-example``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from sparseps.online import Ledger, write_stream

START = "20240101"


def _run(config: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sparseps.cli", "online", str(config)], check=True)
    return time.perf_counter() - start


def _by_day(records: list[dict]) -> dict[str, float]:
    """Sample-weighted mean progressive AUC per day."""
    days: dict[str, list] = {}
    for r in records:
        days.setdefault(r["day"], []).append((r["eval"]["auc"], r["eval"]["count"]))
    return {
        d: float(np.average([a for a, _ in v], weights=[c for _, c in v])) for d, v in days.items()
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="online-example")
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--splits-per-day", type=int, default=8)
    p.add_argument("--rows-per-split", type=int, default=2000)
    p.add_argument("--drift", type=float, default=0.8, help="radians per day")
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    out = Path(args.out).resolve()
    if (out / "online").exists() or (out / "frozen").exists():
        sys.exit(f"{out} holds an earlier run (online/ or frozen/); pick another --out")
    info = write_stream(
        out / "data", start_day=START, days=args.days, splits_per_day=args.splits_per_day,
        rows_per_split=args.rows_per_split, seed=args.seed, drift=args.drift,
    )  # fmt: skip
    passes_per_day = args.splits_per_day // 2
    common = {
        "job": {"server_num": 1, "worker_num": 2, "mode": "sync"},
        "data": {
            "root": "data",
            "split_minutes": 5,
            "splits_per_pass": 2,
            "batch_size": 256,
            "wait_timeout_s": 60,
            "poll_s": 0.5,
        },  # fmt: skip
        "model": {"emb_dim": 8, "hidden": [32, 16], "dense_lr": 0.005, "deep_lr": 0.03},
    }
    online = {
        **common,
        "schedule": {"start_day": START, "days": args.days, "passes_per_day": passes_per_day},
        "save": {
            "model_dir": "online",
            "delta_every": 1,
            "checkpoint_every": passes_per_day,
            "keep_checkpoints": args.days,
            "check_inference": True,
        },  # fmt: skip
    }
    day1 = f"online/checkpoints/{passes_per_day - 1:06d}-{START}-{passes_per_day - 1:03d}"
    second = (dt.datetime.strptime(START, "%Y%m%d") + dt.timedelta(days=1)).strftime("%Y%m%d")
    frozen = {
        **common,
        "schedule": {
            "start_day": second,
            "days": args.days - 1,
            "passes_per_day": passes_per_day,
            "evaluate_only": True,
        },  # fmt: skip
        "model": {**common["model"], "init_checkpoint": day1},
        "save": {"model_dir": "frozen"},
    }
    (out / "online.yaml").write_text(yaml.safe_dump(online, sort_keys=False))
    (out / "frozen.yaml").write_text(yaml.safe_dump(frozen, sort_keys=False))
    online_s = _run(out / "online.yaml")
    frozen_s = _run(out / "frozen.yaml")
    trained = Ledger.of(out / "online").passes()
    held = Ledger.of(out / "frozen").passes()
    online_day, frozen_day = _by_day(trained), _by_day(held)
    print(f"\n{'day':10} {'bayes':>7} {'online':>7} {'frozen':>7}")
    for day, bayes in info["bayes_auc"].items():
        fz = f"{frozen_day[day]:.4f}" if day in frozen_day else "-"
        print(f"{day:10} {bayes:7.4f} {online_day[day]:7.4f} {fz:>7}")
    later = [r["eval"]["auc"] for r in trained[passes_per_day:]]
    summary = {
        "rows": info["rows"], "passes": len(trained), "online_s": round(online_s, 1),
        "frozen_s": round(frozen_s, 1),
        "online_auc_after_day1": round(float(np.mean(later)), 4),
        "frozen_auc_after_day1": round(float(np.mean([r["eval"]["auc"] for r in held])), 4),
        "max_inference_diff": max(r["inference_max_diff"] for r in trained),
        # preloading: after the first pass, data is in memory before training asks for it
        "max_data_wait_s_after_first": max(r["data_wait_s"] for r in trained[1:]),
    }  # fmt: skip
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
