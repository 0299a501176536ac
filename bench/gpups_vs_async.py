"""GPUPS against plain async on the CPU: ``sparseps demo --gpups`` and ``sparseps demo``
on the same files, alternating, in one run (issue 56, the CPU speed check).

``python bench/gpups_vs_async.py [--rows 300000] [--rounds 2]`` writes the demo's data
once (``sparseps demo`` with ``--rows``, the first run), then runs ``sparseps demo
--gpups --device cpu`` (the pipeline: the train files cut into ``--gpups-passes`` passes,
each prepared while the one before trains) and plain ``sparseps demo`` (async) on those
files, ``--rounds`` times, the order alternating by round. Prints per round both
samples/s (the demo's own figure: rows trained over the training seconds; GPUPS loads its
data into memory first, ``load_s``, outside them, as ``sparseps demo`` reports it), the
ratio gpups/async, both test AUCs and their gap, and the box's load average before and
after: on a shared box the ratio of the same round is the figure, not the rates.

Not a test: the 2-core box is shared and loaded; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _demo(out: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "sparseps.cli", "demo", "--out", str(out), "--json",
               "--no-progress", *extra]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    line = [x for x in done.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--gpups-passes", type=int, default=2)
    args = p.parse_args()
    out = {"load_before": list(os.getloadavg()), "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        first = _demo(Path(tmp) / "data", ["--rows", str(args.rows)])  # writes the data
        files = ["--train", first["train_data"], "--test", first["test_data"]]
        shapes = {
            "gpups": [*files, "--gpups", "--device", "cpu",
                      "--gpups-passes", str(args.gpups_passes)],
            "async": files,
        }  # fmt: skip
        for r in range(args.rounds):
            row = {}
            for name in list(shapes)[:: 1 if r % 2 == 0 else -1]:
                got = _demo(Path(tmp) / f"{name}{r}", shapes[name])
                row[name] = {k: got.get(k) for k in ("samples_per_s", "test_auc", "train_s",
                                                     "load_s", "worker0_timings")}  # fmt: skip
                row[name]["load_average"] = list(os.getloadavg())
            row["ratio_samples_per_s"] = round(
                row["gpups"]["samples_per_s"] / row["async"]["samples_per_s"], 3
            )
            row["auc_gap"] = round(row["gpups"]["test_auc"] - row["async"]["test_auc"], 4)
            out["rounds"].append(row)
            print(json.dumps(row), flush=True)
    out["load_after"] = list(os.getloadavg())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
