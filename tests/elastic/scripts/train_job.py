"""A small sync-mode training job for tests/elastic/test_scale_launched.py (run it with
``sparseps launch``): wide&deep on planted data, per-step timestamps, a checkpoint.

Usage: train_job.py OUT [--steps N] [--gate FILE] [--step-sleep S] [--hold FILE]. Each
worker trains ``--steps`` batches of its own planted data (one pass) and records the wall
time of every step in ``OUT/steps.R.json``. Worker 0 sleeps ``--step-sleep`` after each
step while the gate FILE does not exist, and waits at step ``steps - 5`` until it does
(the test opens the gate once it has scaled the job, so the scales happen mid-training;
the wait is recorded and left out of the stall). With ``--hold``, worker 0 also waits at
step 10 (after writing ``OUT/progress``) until the hold FILE exists: the test lets the job
go on once nothing else runs beside it. None of them changes what is trained. Worker 0
appends each step's time to ``OUT/steps.live`` as it happens (the tests' stall watch),
saves a checkpoint to ``OUT/ckpt`` and every dense parameter to ``OUT/dense.npz``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import sparseps as sps
from sparseps.data import Batch
from sparseps.testing import planted_batches

SLOTS = ("C1", "C2", "C3")
BATCH = 64
VOCAB = 400


def batches(seed: int, count: int) -> list[Batch]:
    # labels from the sparse slots only: the dense features are noise to this job
    return planted_batches(seed, count, BATCH, SLOTS, vocab=VOCAB, dense_term=False)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--gate", default="")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="worker 0, per step")
    parser.add_argument("--hold", default="", help="worker 0 waits at step 10 for this file")
    args = parser.parse_args()
    sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    import torch  # a worker's only: servers start without it (~1.4 CPU-s each)

    from sparseps.models import WideDeep

    torch.manual_seed(0)
    rank = sps.worker_index()
    model = WideDeep(SLOTS, 2, emb_dim=4, hidden=(8,))
    trainer = sps.Trainer(model, strategy=sps.Strategy(mode="sync"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times: list[float] = []
    gate = {"step": args.steps - 5, "waited_s": 0.0}

    def wait_for(path: str) -> None:
        deadline = time.monotonic() + 120
        while not Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    # each step's predictions, summed: the first step where a scaled job's differ from the
    # unscaled one's is where its state first differed (the tests name it on a mismatch)
    sums: list[float] = []

    # worker 0's steps as they happen, for the tests' stall watch (a line per step)
    live = open(out / "steps.live", "a", buffering=1) if rank == 0 else None  # noqa: SIM115

    def on_batch(step, stats) -> None:  # noqa: ARG001 - the callback's signature
        times.append(time.time())
        if live is not None:
            live.write(f"{times[-1]}\n")
        sums.append(float(np.asarray(step.predictions, np.float64).sum()))
        if rank == 0 and len(times) == 10:
            (out / "progress").write_text("10")  # the test scales from here on
            if args.hold:
                wait_for(args.hold)
        if rank == 0 and args.step_sleep and not (args.gate and Path(args.gate).exists()):
            time.sleep(args.step_sleep)  # a longer pass until the gate opens (sync: both wait)
        if rank == 0 and args.gate and len(times) == gate["step"]:
            start = time.time()
            (out / "at_gate").write_text(str(start))
            wait_for(args.gate)
            gate["waited_s"] = time.time() - start

    trainer.train_from_dataset(batches(rank, args.steps), print_period=0, on_batch=on_batch)
    (out / f"steps.{rank}.json").write_text(
        json.dumps({"times": times, "gate": gate, "prediction_sums": sums})
    )
    trainer.save_checkpoint(out / "ckpt")
    if rank == 0:
        np.savez(
            out / "dense.npz", **{k: v.detach().numpy() for k, v in model.state_dict().items()}
        )
    trainer.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
