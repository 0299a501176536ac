"""A small training job for the observability tests (every role runs it).

Workers train WideDeep (tiny MLP) for ``--passes`` passes over their share of ``--train``,
write DIR/worker.R.json (samples and batches trained, the last pass's global AUC and
logloss), then stay alive until DIR/release
exists (at most 120 s) so that the test can scrape and load the status page.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import sparseps as sps

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--dir", required=True)
p.add_argument("--passes", type=int, default=2)
args = p.parse_args()

sps.init()
if sps.is_server():
    # tables come from the workers' create_table: the server never imports torch (seconds
    # of CPU per process on 2 cores, while the workers import it)
    sps.run_server()
    sys.exit(0)

import torch  # noqa: E402

from sparseps.data import CRITEO, QueueDataset  # noqa: E402
from sparseps.models import WideDeep  # noqa: E402

torch.manual_seed(0)
model = WideDeep(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(16,))
trainer = sps.Trainer(model, strategy=sps.Strategy(mode="async"))
rank = sps.worker_index()
samples = batches = 0
result = None
for _ in range(args.passes):
    data = QueueDataset([args.train], CRITEO, batch_size=64, threads=1)
    result = trainer.train_from_dataset(data, print_period=5)
    samples += result.samples
    batches += result.batches
assert result is not None
folder = Path(args.dir)
(folder / f"worker.{rank}.json").write_text(
    json.dumps(
        {
            "samples": samples,
            "batches": batches,
            "auc": result.metrics.auc,
            "logloss": result.metrics.logloss,
            "passes": trainer.passes,
        }
    )
)
deadline = time.monotonic() + 120
while not (folder / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
trainer.stop()
sps.stop()
