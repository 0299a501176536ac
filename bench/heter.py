"""Heter workers: request gathering, and heter workers against plain async.

``sparseps bench heter`` runs the job of ``bench e2e`` (wide&deep, 400-400-400 MLP, dim-8
embeddings, one pass, 1 server) in these shapes, alternately, 2 rounds each (1 with
``--quick``); the best round of each counts:

- gathering: 4 trainers and 1 heter worker (trainer batch :data:`GATHER_BATCH`), with
  request gathering (``Heter()``'s default window) and without it (``gather_rows=0``: one
  request per device batch, the heter worker of earlier releases), in the same run;
- ratios (not with ``--quick``): 2 trainers as plain async, with 1 heter worker (2:1) and
  with 2 (1:1), batch 512.

Records:

- ``heter_gather_samples_per_s``: samples/s of the 4:1 job with gathering (baseline: the
  same job without it; the target is a ratio >= 1.5);
- ``heter_gather_batch_ratio``: the heter worker's mean device batch over the trainers'
  batch (baseline: the same without gathering, 1.0; the target is >= 3), from its log;
- ``heter_gather_test_auc``: held-out AUC with gathering (baseline: without);
- ``heter_<ratio>_samples_per_s``, ``heter_<ratio>_test_auc``: with heter workers
  (baseline: plain async); ``heter_<ratio>_trainer_wait``: the fraction of worker 0's pass
  spent waiting for its heter worker's replies; params carry ``heter_idle`` (the fraction of
  time since their first request the heter workers waited for requests, from their logs).

On one 2-core machine heter workers take cores from the trainers and the server: the
ratio figures show the cost of the split (one more hop per step) and where the time goes,
not the speed-up of dense compute on an accelerator, which needs the heter workers on other
machines (docs/heterps.md). Gathering gains from one dense update (push and pull of the
dense table) and one forward/backward per device batch instead of per trainer step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from sparseps.benchmarking import BenchRecord, load_benchmark

GATHER_BATCH = 128
GATHER_TRAINERS = 4
_IDLE = re.compile(r"busy ([0-9.]+) s, idle ([0-9.]+) s")
_BATCHES = re.compile(r"in (\d+) device batches \(mean ([0-9.]+) rows, ([0-9.]+) steps\)")
_JOB = Path(__file__).resolve().parents[1] / "sparseps" / "jobs" / "wide_deep_job.py"


def _heter_idle(log: Path) -> float:
    busy = idle = 0.0
    for path in sorted(log.glob("heter_worker.*.log")):
        found = _IDLE.findall(path.read_text())
        if found:
            busy += float(found[-1][0])
            idle += float(found[-1][1])
    return idle / max(busy + idle, 1e-9)


def _mean_device_batch(log: Path) -> float:
    """Rows per device batch over the job's heter workers (from their last log line)."""
    rows = batches = 0.0
    for path in sorted(log.glob("heter_worker.*.log")):
        found = _BATCHES.findall(path.read_text())
        if found:
            count, mean, _ = found[-1]
            rows += int(count) * float(mean)
            batches += int(count)
    return rows / max(batches, 1.0)


def launch(folder: Path, out: Path, *, trainers: int, heter: int, batch: int,
           job_options: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """The demo job, 1 server, ``trainers`` trainers and ``heter`` heter workers."""
    result = out / "result.json"
    cmd = [
        sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1",
        "--worker-num", str(trainers), *(("--heter-worker-num", str(heter)) if heter else ()),
        "--log-dir", str(out / "log"), str(_JOB), "--train", str(folder / "train"),
        "--test", str(folder / "test"), "--result", str(result), "--mode", "async",
        "--batch-size", str(batch), *job_options,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    found = json.loads(result.read_text())
    timings = found["worker0_timings"]
    found["trainer_wait"] = timings.get("heter_wait_s", 0.0) / found["worker0_pass_s"]
    found["heter_idle"] = _heter_idle(out / "log")
    found["device_batch"] = _mean_device_batch(out / "log")
    return found


def _shapes(quick: bool) -> dict[str, dict]:
    four = {"trainers": GATHER_TRAINERS, "heter": 1, "batch": GATHER_BATCH}
    shapes = {
        "gather": {**four},
        "no_gather": {**four, "job_options": ("--heter-gather-rows", "0")},
    }
    if not quick:
        shapes |= {
            "async": {"trainers": 2, "heter": 0, "batch": 512},
            "2:1": {"trainers": 2, "heter": 1, "batch": 512},
            "1:1": {"trainers": 2, "heter": 2, "batch": 512},
        }
    return shapes


def run(quick: bool = False) -> list[BenchRecord]:
    e2e = load_benchmark("e2e")
    rows = e2e.QUICK_ROWS if quick else e2e.ROWS
    folder = e2e._data(rows)
    shapes = _shapes(quick)
    runs: dict[str, list[dict]] = {name: [] for name in shapes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1 if quick else 2):
            for name, shape in shapes.items():
                out = Path(tmp) / f"{name.replace(':', '-')}-{i}"
                out.mkdir()
                runs[name].append(launch(folder, out, **shape))
    best = {name: max(found, key=lambda r: r["samples_per_s"]) for name, found in runs.items()}
    return _gather_records(rows, runs, best) + _ratio_records(rows, runs, best)


def _gather_records(rows: int, runs: dict, best: dict) -> list[BenchRecord]:
    on, off = best["gather"], best["no_gather"]
    params = {
        "rows": rows, "servers": 1, "trainers": GATHER_TRAINERS, "heter_workers": 1,
        "batch": GATHER_BATCH, "model": "wide_deep 400-400-400 dim 8", "window": "Heter()",
        "rounds": [round(r["samples_per_s"], 1) for r in runs["gather"]],
        "no_gather_rounds": [round(r["samples_per_s"], 1) for r in runs["no_gather"]],
        "device_batch_rows": round(on["device_batch"], 1),
        "no_gather_device_batch_rows": round(off["device_batch"], 1),
        "heter_idle": round(on["heter_idle"], 3), "no_gather_heter_idle": round(off["heter_idle"], 3),
        "trainer_wait": round(on["trainer_wait"], 3),
        "no_gather_trainer_wait": round(off["trainer_wait"], 3),
    }  # fmt: skip
    return [
        BenchRecord("heter_gather_samples_per_s", on["samples_per_s"], "samples/s",
                    off["samples_per_s"], params),
        BenchRecord("heter_gather_batch_ratio", on["device_batch"] / GATHER_BATCH, "x",
                    off["device_batch"] / GATHER_BATCH, params),
        BenchRecord("heter_gather_test_auc", on["test_auc"], "auc", off["test_auc"], params),
    ]  # fmt: skip


def _ratio_records(rows: int, runs: dict, best: dict) -> list[BenchRecord]:
    if "async" not in best:
        return []
    base = best["async"]
    records = []
    for name in ("2:1", "1:1"):
        ours = best[name]
        params = {
            "rows": rows, "servers": 1, "trainers": 2, "heter_workers": 2 // int(name[0]),
            "ratio": name, "batch": 512, "model": "wide_deep 400-400-400 dim 8",
            "rounds": [round(r["samples_per_s"], 1) for r in runs[name]],
            "async_rounds": [round(r["samples_per_s"], 1) for r in runs["async"]],
            "heter_idle": round(ours["heter_idle"], 3), "worker0_timings": ours["worker0_timings"],
        }  # fmt: skip
        tag = name.replace(":", "_")
        records += [
            BenchRecord(f"heter_{tag}_samples_per_s", ours["samples_per_s"], "samples/s",
                        base["samples_per_s"], params),
            BenchRecord(f"heter_{tag}_test_auc", ours["test_auc"], "auc", base["test_auc"], params),
            BenchRecord(f"heter_{tag}_trainer_wait", ours["trainer_wait"], "fraction", None, params),
        ]  # fmt: skip
    return records
