"""Heter workers against plain async: the demo job with its dense network on heter workers.

``sparseps bench heter``: the job of ``bench e2e`` (wide&deep, 400-400-400 MLP, dim-8
embeddings, batch 512, one pass, 1 server + 2 trainers) runs as plain async, with 1 heter
worker (2:1 trainers to heter workers) and with 2 (1:1), alternately, 2 rounds each (1
with ``--quick``); the best round of each counts. Records:

- ``heter_<ratio>_samples_per_s``: samples/s with heter workers (baseline: plain async);
- ``heter_<ratio>_test_auc``: held-out AUC (baseline: plain async);
- ``heter_<ratio>_trainer_wait``: the fraction of worker 0's pass spent waiting for its
  heter worker's replies; params carry ``heter_idle`` (the fraction of time since their
  first request the heter workers waited for requests, from their logs).

On one 2-core machine heter workers take cores from the trainers and the server: the
figures show the cost of the split (one more hop per step) and where the time goes, not
the speed-up of dense compute on an accelerator, which needs the heter workers on other
machines (docs/heterps.md).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from sparseps.benchmarking import BenchRecord, load_benchmark

_IDLE = re.compile(r"busy ([0-9.]+) s, idle ([0-9.]+) s")


def _heter_idle(log: Path) -> float:
    busy = idle = 0.0
    for path in sorted(log.glob("heter_worker.*.log")):
        found = _IDLE.findall(path.read_text())
        if found:
            busy += float(found[-1][0])
            idle += float(found[-1][1])
    return idle / max(busy + idle, 1e-9)


def run(quick: bool = False) -> list[BenchRecord]:
    e2e = load_benchmark("e2e")
    rows = e2e.QUICK_ROWS if quick else e2e.ROWS
    folder = e2e._data(rows)
    configs = {"async": (), "2:1": ("--heter-worker-num", "1"), "1:1": ("--heter-worker-num", "2")}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1 if quick else 2):
            for name, options in configs.items():
                out = Path(tmp) / f"{name.replace(':', '-')}-{i}"
                out.mkdir()
                result = e2e._sparseps(folder, out, options)
                timings = result["worker0_timings"]
                result["trainer_wait"] = timings.get("heter_wait_s", 0.0) / result["worker0_pass_s"]
                result["heter_idle"] = _heter_idle(out / "log")
                runs[name].append(result)
    best = {name: max(found, key=lambda r: r["samples_per_s"]) for name, found in runs.items()}
    base = best["async"]
    records = []
    for name in ("2:1", "1:1"):
        ours = best[name]
        params = {
            "rows": rows, "servers": 1, "trainers": 2, "heter_workers": 2 // int(name[0]),
            "ratio": name, "batch": e2e.BATCH, "model": "wide_deep 400-400-400 dim 8",
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
