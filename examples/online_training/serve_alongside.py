"""A streaming job and a prediction service side by side: the served model follows the passes.

1. writes DAYS days of 5-minute splits (as ``run.py`` does);
2. starts ``sparseps online OUT/online.yaml`` (1 server + 2 workers, sync, passes of 2
   splits, a delta inference save per pass, base + checkpoint at the end of each day);
3. once the first base is saved, starts ``sparseps serve OUT/online/inference`` (a child
   process on a free port, polling every 0.2 s);
4. while the job runs, every 0.5 s asks ``GET /model`` and ``POST /predict`` (the first 256
   rows of the last day, as JSON); each time the served sequence changes it prints the
   save, the passes it holds, how long after the save was written it was served, and the
   mean prediction;
5. after the job: waits until the last save is served, then checks the service's
   predictions against ``sparseps.Predictor`` on the folder (max difference, expected 0).

Usage: ``python examples/online_training/serve_alongside.py --out /tmp/serve-example``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from sparseps.checkpoint import inference
from sparseps.checkpoint.predictor import Predictor
from sparseps.data import CRITEO, QueueDataset
from sparseps.files import manifest as mf
from sparseps.online import write_stream
from sparseps.serving import ServeProcess, criteo_request_rows

START = "20240101"


def wait_for_base(folder: Path, job: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = inference.saves(folder)
        if any(kind == "base" and (p / mf.MANIFEST).is_file() for _, kind, p in found):
            return
        if job.poll() is not None:
            sys.exit(f"sparseps online exited with {job.returncode} before its first base")
        time.sleep(0.2)
    sys.exit(f"no base inference save in {folder} within {timeout} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="serve-example")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--splits-per-day", type=int, default=16)
    p.add_argument("--rows-per-split", type=int, default=2000)
    args = p.parse_args()
    out = Path(args.out).resolve()
    if (out / "online").exists():
        sys.exit(f"{out} holds an earlier run (online/); pick another --out")
    write_stream(
        out / "data", start_day=START, days=args.days, splits_per_day=args.splits_per_day,
        rows_per_split=args.rows_per_split, seed=11, drift=0.8,
    )  # fmt: skip
    passes_per_day = args.splits_per_day // 2
    config = {
        "job": {"server_num": 1, "worker_num": 2, "mode": "sync"},
        "data": {"root": "data", "split_minutes": 5, "splits_per_pass": 2, "batch_size": 256},
        "schedule": {"start_day": START, "days": args.days, "passes_per_day": passes_per_day},
        "model": {"emb_dim": 8, "hidden": [32, 16], "dense_lr": 0.005, "deep_lr": 0.03},
        "save": {"model_dir": "online", "delta_every": 1, "checkpoint_every": passes_per_day},
    }
    (out / "online.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    last_split = sorted((out / "data").glob("*/*/part-00000.tsv"))[-1]
    rows = criteo_request_rows(last_split, 256)
    served_dir = out / "online" / "inference"
    job_cmd = [sys.executable, "-m", "sparseps.cli", "online", str(out / "online.yaml")]
    job = subprocess.Popen(job_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[dict] = []
    try:
        wait_for_base(served_dir, job, timeout=600)
        with (
            ServeProcess(served_dir, poll_s=0.2) as service,
            httpx.Client(base_url=service.url, timeout=30) as client,
        ):
            print(f"serving {served_dir} on {service.url}")
            print(f"{'sequence':>8} {'save':12} {'passes':>6} {'served after':>12} {'mean p':>7}")
            while True:
                running = job.poll() is None
                model = client.get("/model").json()
                if not seen or model["sequence"] != seen[-1]["sequence"]:
                    answer = client.post("/predict", json={"rows": rows}).json()
                    last = served_dir / (model["deltas"] or [model["base"]])[-1]
                    after = time.time() - (last / mf.MANIFEST).stat().st_mtime
                    seen.append({"sequence": answer["sequence"], "save": last.name,
                                 "passes": model["passes"], "served_after_s": round(after, 2),
                                 "mean": float(np.mean(answer["predictions"]))})  # fmt: skip
                    s = seen[-1]
                    print(f"{s['sequence']:>8} {s['save']:12} {s['passes']:>6} "
                          f"{s['served_after_s']:>11.2f}s {s['mean']:>7.4f}")  # fmt: skip
                if not running:
                    newest = inference.chain(served_dir)[-1].name
                    if model["deltas"][-1:] == [newest] or model["base"] == newest:
                        break
                time.sleep(0.5)
            final = np.float32(client.post("/predict", json={"rows": rows}).json()["predictions"])
            (out / "rows.tsv").write_text(
                "\n".join(last_split.read_text().splitlines()[:256]) + "\n"
            )
            dataset = QueueDataset([str(out / "rows.tsv")], CRITEO, batch_size=256, threads=1)
            offline = Predictor(served_dir).predict(dataset)
    finally:
        if job.poll() is None:
            job.terminate()
            job.wait(60)
    summary = {
        "job_exit": job.returncode,
        "models_served": len(seen),
        "max_served_after_s": max(s["served_after_s"] for s in seen),
        "final_max_diff_vs_predictor": float(np.abs(final - offline).max()),
    }
    print(json.dumps(summary))
    return 0 if job.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
