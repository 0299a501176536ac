"""Training modes on the demo job: hybrid and push merging against async, AUC against sync.

``sparseps bench modes``: the job of ``bench e2e`` and ``sparseps demo`` (wide&deep,
400-400-400 MLP, dim-8 embeddings, batch 512, one pass, 1 server + 2 workers) on the
same generated Criteo-format rows, once per configuration, in this order: sync, async,
hybrid (its default: the pushes of 2 steps merged, one per worker), hybrid with
``push_merge="off"``, async with ``push_merge="auto"``, async with ``push_merge="on"``
(window 8). Records, per configuration other than async:

- ``<config>_samples_per_s``: training throughput (baseline: async in this run);
- ``<config>_test_auc`` (async's too): held-out AUC (baseline: sync in this run, whose AUC does not
  depend on timing); ``params["auc_minus_sync"]`` is the difference.

Params carry worker 0's timings (``push_s``: seconds its push thread spent sending) and,
for the merging configurations, nothing else: the merge shows in fewer push seconds. On
a shared 2-core machine one round is noisy: run it twice and compare the ratios.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sparseps.benchmarking import BenchRecord, load_benchmark

ROWS, QUICK_ROWS = 300_000, 100_000

CONFIGS = {
    "sync": ("--mode", "sync"),
    "async": ("--mode", "async"),
    "hybrid": ("--mode", "hybrid"),
    "hybrid_merge_off": ("--mode", "hybrid", "--push-merge", "off"),
    "async_merge_auto": ("--mode", "async", "--push-merge", "auto"),
    "async_merge_on": ("--mode", "async", "--push-merge", "on", "--push-merge-window", "8"),
}


def run(quick: bool = False) -> list[BenchRecord]:
    e2e = load_benchmark("e2e")
    rows = QUICK_ROWS if quick else ROWS
    folder = e2e._data(rows)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in CONFIGS.items():
            out = Path(tmp) / name
            out.mkdir()
            results[name] = e2e._sparseps(folder, out, job_options=options)
    base, sync = results["async"], results["sync"]
    records = []
    for name, ours in results.items():
        params = {
            "rows": rows, "servers": 1, "workers": 2, "batch": e2e.BATCH,
            "model": "wide_deep 400-400-400 dim 8", "options": " ".join(CONFIGS[name]),
            "auc_minus_sync": round(ours["test_auc"] - sync["test_auc"], 4),
            "async_samples_per_s": base["samples_per_s"],
            "worker0_timings": ours["worker0_timings"],
        }  # fmt: skip
        if name != "async":
            records.append(BenchRecord(f"{name}_samples_per_s", ours["samples_per_s"],
                                       "samples/s", base["samples_per_s"], params))  # fmt: skip
        if name != "sync":
            records.append(
                BenchRecord(f"{name}_test_auc", ours["test_auc"], "auc", sync["test_auc"], params)
            )
    return records
