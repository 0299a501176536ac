"""Worker 1 never joins the collectives; worker 0 (sync mode) must time out naming the setting.

Writes ``{"error": type, "setting": ..., "seconds": ..., "waited": ...}`` to --out (worker 0).
"""

import argparse
import json
import os
import sys
import time

import sparseps as sps
from sparseps.data.schema import Batch, Slot

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--timeout", type=float, default=2.0)
args = p.parse_args()

sps.init()
model = sps.nn.SparseEmbedding("t", 2, slots=("a",))
trainer = sps.Trainer(model, strategy=sps.Strategy(mode="sync", collective_timeout=args.timeout))
if sps.is_server():
    sps.run_server()
    sys.exit(0)
if sps.worker_index() == 1:
    # a straggler: it never takes part in the pass; it leaves once worker 0 has given up
    # (its --out written), as a sleep of 4 x --timeout did, without sleeping the rest
    deadline = time.monotonic() + 60
    while not os.path.exists(args.out) and time.monotonic() < deadline:
        time.sleep(0.05)
    sps.stop()
    sys.exit(0)

import numpy as np  # noqa: E402

batch = Batch(np.zeros(2, np.float32), np.zeros((2, 0), np.float32),
              {"a": Slot(np.array([1, 2], np.uint64), np.array([0, 1, 2], np.int64))})  # fmt: skip
start = time.monotonic()
try:
    trainer.train_from_dataset([batch], print_period=0)
    result = {"error": None}
except sps.DeadlineError as exc:
    result = {"error": type(exc).__name__, "setting": exc.setting, "seconds": exc.seconds,
              "message": str(exc)}  # fmt: skip
result["waited"] = time.monotonic() - start
with open(args.out, "w") as f:
    json.dump(result, f)
sps.stop()
