"""A job that hangs on purpose (every role runs it): ``hang_job.py --dir DIR``.

Worker 1 never reaches the barriers: it sleeps in ``never_arrive`` until DIR/release
exists. Worker 0 calls a gloo barrier (``collectives.barrier``) and then a worker barrier
(``sps.barrier_worker``), each with a 2 s timeout; it writes each timeout's message to
DIR/errors.json, then waits for DIR/release too (so that the test can run
``sparseps diagnose`` on the live job). Both wait at most 120 s.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import sparseps as sps
from sparseps.core import collectives
from sparseps.errors import DeadlineError

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
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
    sps.run_server()
    sys.exit(0)
if sps.worker_index() == 1:
    never_arrive()
    os._exit(0)  # its gloo peer gave up on a barrier: skip the group's teardown
errors = {}
for name, call in (
    ("collective", lambda: collectives.barrier(timeout=2.0)),
    ("barrier", lambda: sps.barrier_worker(timeout=2.0)),
):
    try:
        call()
        errors[name] = None
    except DeadlineError as exc:
        errors[name] = str(exc)
(folder / "errors.json").write_text(json.dumps(errors))
wait_for_release()
sys.stdout.flush()
os._exit(0)
