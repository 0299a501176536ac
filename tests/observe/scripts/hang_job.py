"""A job that hangs on purpose (every role runs it): ``hang_job.py --dir DIR --train T``.

Both workers start a trainer (2 s RPC timeout; the server only serves). Then worker 1
never reaches the barriers: it sleeps in ``never_arrive`` until DIR/release exists. Worker
0 calls a gloo barrier (``collectives.barrier``, 2 s timeout: worker 1 may still be on its
way to ``never_arrive`` when it begins) and a worker barrier (``sps.barrier_worker``, 1 s:
worker 1 waits by then), then stops the server (SIGSTOP) and trains a pass, whose pulls
time out; then, outside a training pass, runs an inference pass and a direct client call
(``stats``), which time out too (SIGCONT follows). Last it computes global pass metrics
(their all-reduce times out after 1 s: worker 1 never takes part). It writes each
timeout's message to DIR/errors.json, then waits for DIR/release too (so that the test can
run ``sparseps diagnose`` on the live job). Both wait at most 120 s.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.errors import DeadlineError

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--train", required=True)
args = p.parse_args()
folder = Path(args.dir)


def wait_for_release() -> None:
    deadline = time.monotonic() + 120
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def never_arrive() -> None:
    wait_for_release()


sps.init()
if sps.is_server():
    # tables come from the workers' create_table: the server never imports torch (seconds
    # of CPU on 2 cores while the workers import it)
    sps.run_server()
    sys.exit(0)

from sparseps.core import collectives  # noqa: E402
from sparseps.metrics import CTRMetrics  # noqa: E402
from sparseps.models import WideDeep  # noqa: E402

model = WideDeep(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(8,))
trainer = sps.Trainer(model, strategy=sps.Strategy(mode="async", rpc_timeout=2.0))
server_pid = trainer.client.stats()["servers"][0]["pid"]  # (every worker starts the trainer)
if sps.worker_index() == 1:
    never_arrive()
    os._exit(0)  # its gloo peer gave up on a barrier: skip the group's teardown
errors = {}
for name, call in (
    ("collective", lambda: collectives.barrier(timeout=2.0)),
    ("barrier", lambda: sps.barrier_worker(timeout=1.0)),
):
    try:
        call()
        errors[name] = None
    except DeadlineError as exc:
        errors[name] = str(exc)
os.kill(server_pid, signal.SIGSTOP)
try:
    for name, call in (
        ("rpc", lambda: trainer.train_from_dataset(
            QueueDataset([args.train], CRITEO, batch_size=32, threads=1))),
        ("infer", lambda: trainer.infer_from_dataset(
            QueueDataset([args.train], CRITEO, batch_size=32, threads=1))),
        ("client", lambda: trainer.client.stats()),
    ):  # fmt: skip
        try:
            call()
            errors[name] = None
        except DeadlineError as exc:
            errors[name] = str(exc)
finally:
    os.kill(server_pid, signal.SIGCONT)
try:
    CTRMetrics().compute(global_=True, timeout=1.0)
    errors["metrics"] = None
except DeadlineError as exc:
    errors["metrics"] = str(exc)
(folder / "errors.json").write_text(json.dumps(errors))
wait_for_release()
sys.stdout.flush()
os._exit(0)
