"""GPUPS and heter workers on a GPU against the same jobs on the CPU (needs a CUDA device).

``sparseps bench gpu``: the job of ``bench e2e`` (wide&deep, 400-400-400 MLP, dim-8
embeddings, batch 512, one pass, 1 server + 2 workers) in five shapes, one round each on
the same files, in this order: plain async (reference), heter workers 1:1 with
``--heter-device cpu`` then ``cuda``, GPUPS with ``device="cpu"`` then ``"cuda"``. Records:

- ``gpups_cuda_samples_per_s``, ``gpups_cuda_test_auc``: GPUPS with the pass's rows and
  their optimizer rule on the GPU (baseline: the same GPUPS job on the CPU); params carry
  each side's per-pass build seconds;
- ``heter_cuda_samples_per_s``, ``heter_cuda_test_auc``: the dense network on the GPU in
  two heter workers (baseline: the same heter workers on the CPU); params carry the
  trainers' wait fraction of each;
- params of every record: the GPU's name and plain async's samples/s and AUC.

Both workers (and both heter workers) share the one GPU when the machine has one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sparseps.benchmarking import BenchRecord, load_benchmark
from sparseps.errors import ConfigError

SHAPES = {
    "async": ((), ()),
    "heter_cpu": (("--heter-worker-num", "2", "--heter-device", "cpu"), ()),
    "heter_cuda": (("--heter-worker-num", "2", "--heter-device", "cuda"), ()),
    "gpups_cpu": ((), ("--mode", "gpups", "--device", "cpu")),
    "gpups_cuda": ((), ("--mode", "gpups", "--device", "cuda")),
}


def _wait(result: dict) -> float:
    return result["worker0_timings"].get("heter_wait_s", 0.0) / result["worker0_pass_s"]


def run(quick: bool = False) -> list[BenchRecord]:
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("bench gpu: no CUDA device is visible (run it on a machine with a GPU)")
    e2e = load_benchmark("e2e")
    rows = e2e.QUICK_ROWS if quick else e2e.ROWS
    folder = e2e._data(rows)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (options, job_options) in SHAPES.items():
            out = Path(tmp) / name
            out.mkdir()
            results[name] = e2e._sparseps(folder, out, options, job_options)
            print(f"{name}: {results[name]['samples_per_s']:.1f} samples/s, "
                  f"auc {results[name]['test_auc']:.4f}", flush=True)  # fmt: skip
    params = {
        "rows": rows,
        "servers": 1,
        "workers": 2,
        "batch": e2e.BATCH,
        "gpu": torch.cuda.get_device_name(0),
        "async_samples_per_s": results["async"]["samples_per_s"],
        "async_test_auc": round(results["async"]["test_auc"], 5),
    }
    gpups = {**params, "build_s_cuda": results["gpups_cuda"].get("build_s"),
             "build_s_cpu": results["gpups_cpu"].get("build_s"),
             "device": results["gpups_cuda"].get("device")}  # fmt: skip
    heter = {**params, "heter_workers": 2, "trainer_wait_cuda": round(_wait(results["heter_cuda"]), 3),
             "trainer_wait_cpu": round(_wait(results["heter_cpu"]), 3)}  # fmt: skip
    records = []
    for kind, extra in (("gpups", gpups), ("heter", heter)):
        cuda, cpu = results[f"{kind}_cuda"], results[f"{kind}_cpu"]
        records += [
            BenchRecord(f"{kind}_cuda_samples_per_s", cuda["samples_per_s"], "samples/s",
                        cpu["samples_per_s"], extra),
            BenchRecord(f"{kind}_cuda_test_auc", cuda["test_auc"], "auc", cpu["test_auc"], extra),
        ]  # fmt: skip
    return records
