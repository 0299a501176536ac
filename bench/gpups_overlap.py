"""GPUPS: the stall between two passes, with and without the next pass prepared (issue 17).

``python bench/gpups_overlap.py [--rows 100000] [--rounds 2]`` writes demo data
(``sparseps.data.synthetic.write_dataset``, seeds 2026 and 2027, 2 files of ``rows / 2``
each); day 0 is seed 2026's two files, day 1 its second file and seed 2027's first (so
about half of day 1's keys are day 0's). It launches 1 server + 2 workers on loopback
and, per worker, trains two GPUPS trainers one after the other, each over day 0 then
day 1:

- ``plain``: each pass builds its working set when it begins;
- ``prepared``: the pipeline, ``train_from_dataset(day0, next_dataset=day1)``: day 1's
  keys and the rows of its keys not in day 0 are read while day 0 trains, day 1's build
  takes day 0's final rows for the keys they share, and day 0's write-back is left in
  flight, waited for after day 1's first step.

The **stall** is the time training waits between the passes: the day-0 pass's write-back
(``write_back_s``: results off the device, writes sent, and, unprepared, waited for),
the day-1 pass's build (``build_s``) and its wait for day 0's writes still in flight
(``write_back_wait_s``). The box's load average is printed with the figures. Reported per round for
worker 0 with the ratio prepared/plain of the same round (rounds alternate the order),
the background thread's time (``next_pass_s``), both passes' wall time, and whether the
day-1 rows of the two trainers are equal (they must be, bit for bit).

Not a test: on the shared 2-core box the background thread competes with training.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def _job(args) -> None:
    import sparseps as sps

    sps.init()
    if sps.is_server():
        sps.run_server()
        return
    import torch

    from sparseps.data import CRITEO, InMemoryDataset
    from sparseps.models import WideDeep

    days = []
    for folder in (args.day0, args.day1):
        data = InMemoryDataset(folder.split(","), CRITEO, batch_size=512, threads=1)
        data.load_into_memory()
        days.append(data)
    out = {"rounds": []}
    order = [("plain", False), ("prepared", True)]
    for r in range(args.rounds + 1):  # round 0 warms up (compiled kernels), not reported
        row = {}
        for name, prepared in order if r % 2 == 0 else order[::-1]:
            torch.manual_seed(0)
            prefix = f"{name}{r}"
            model = WideDeep(
                CRITEO.slots, len(CRITEO.dense), emb_dim=8, hidden=(400, 400, 400),
                deep_table=f"{prefix}_deep", wide_table=f"{prefix}_wide",
            )  # fmt: skip
            trainer = sps.Trainer(model, strategy=sps.Strategy(mode=sps.GpuPS(device="cpu")))
            following = days[1] if prepared else None
            first = trainer.train_from_dataset(days[0], print_period=0, next_dataset=following)
            second = trainer.train_from_dataset(days[1], print_period=0)
            build = trainer.state.mode.last_build
            row[name] = {
                "write_back_s": first.timings["write_back_s"],
                "build_s": second.timings["build_s"],
                "write_back_wait_s": second.timings["write_back_wait_s"],
                "stall_s": round(
                    first.timings["write_back_s"]
                    + second.timings["build_s"]
                    + second.timings["write_back_wait_s"],
                    4,
                ),  # fmt: skip
                "next_pass_s": second.timings.get("next_pass_s", 0.0),
                "pass0_s": round(first.seconds, 2),
                "pass1_s": round(second.seconds, 2),
                "sources": {k: build[k] for k in ("carried", "early", "pulled", "phases_s")},
            }
            probe = np.unique(
                np.concatenate([s.values for b in days[1] for s in b.slots.values()])
            )[:: max(1, args.rows // 20000)]
            row[name]["probe"] = trainer.client.pull_full(f"{prefix}_deep", probe).wait()
            trainer.stop()
        equal = np.array_equal(row["plain"].pop("probe"), row["prepared"].pop("probe"))
        row["rows_equal"] = bool(equal)
        row["stall_ratio"] = round(row["prepared"]["stall_s"] / row["plain"]["stall_s"], 3)
        if r:
            out["rounds"].append(row)
    if sps.worker_index() == 0:
        out["load_average"] = list(os.getloadavg())
        Path(args.out).write_text(json.dumps(out))
    sps.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--day0")
    p.add_argument("--day1")
    p.add_argument("--out")
    args = p.parse_args()
    if args.job:
        _job(args)
        return 0
    from sparseps.data.synthetic import write_dataset

    with tempfile.TemporaryDirectory() as tmp:
        parts = {}
        for seed in (2026, 2027):
            write_dataset(Path(tmp) / str(seed), rows=args.rows, seed=seed, files=2, test_rows=1000)
            parts[seed] = sorted(str(f) for f in (Path(tmp) / str(seed) / "train").iterdir())
        # day 0: both files of seed 2026; day 1: its second file and a new one (seed 2027)
        folders = [",".join(parts[2026]), ",".join([parts[2026][1], parts[2027][0]])]
        out = Path(tmp) / "out.json"
        command = [
            sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1",
            "--worker-num", "2", "--log-dir", str(Path(tmp) / "log"), __file__, "--job",
            "--day0", folders[0], "--day1", folders[1], "--out", str(out),
            "--rows", str(args.rows), "--rounds", str(args.rounds),
        ]  # fmt: skip
        done = subprocess.run(command, env=dict(os.environ), capture_output=True, text=True)
        if done.returncode != 0 or not out.is_file():
            print(done.stdout[-3000:], done.stderr[-3000:])
            return 1
        print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
