"""A job script for the launcher tests: ``job.py MODE --dir DIR``.

Every role runs it (fleetrun semantics). Modes, on the workers:

- ``fail``: worker 1 exits with code 3 after joining; worker 0 sleeps (to be stopped).
- ``sleep``: every worker sleeps (the test signals the launcher).
- ``restart``: worker 1's first attempt exits 7 before joining (a marker file in DIR
  remembers it); the second attempt joins and both meet at a barrier.
- ``barrier``: worker 0 waits at a barrier that worker 1 never reaches, records the
  timeout error in DIR/barrier.json, then releases worker 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import sparseps as sps
from sparseps import env as sps_env


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["fail", "sleep", "restart", "barrier"])
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = Path(args.dir)
    me = sps_env.from_environ()
    if args.mode == "restart" and me.role is sps_env.Role.WORKER and me.rank == 1:
        marker = folder / "worker1.attempted"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            print("worker 1: first attempt fails on purpose", flush=True)
            return 7
    sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    rank = sps.worker_index()
    print(f"worker {rank} ready", flush=True)
    if args.mode == "fail":
        if rank == 1:
            print("worker 1: exiting with code 3", flush=True)
            return 3
        time.sleep(120)
    elif args.mode == "sleep":
        time.sleep(120)
    elif args.mode == "restart":
        sps.barrier_worker(timeout=60)
        (folder / f"worker{rank}.done").write_text(str(os.getpid()))
    elif args.mode == "barrier":
        release = folder / "release"
        if rank == 0:
            started = time.monotonic()
            try:
                sps.barrier_worker(timeout=2.0)
                record = {"raised": False}
            except sps.TimeoutError_ as exc:
                record = {
                    "raised": True,
                    "op": exc.op,
                    "role": exc.role,
                    "rank": exc.rank,
                    "seconds": exc.seconds,
                    "setting": exc.setting,
                    "waited": time.monotonic() - started,
                }
            (folder / "barrier.json").write_text(json.dumps(record))
            release.write_text("1")
        else:
            deadline = time.monotonic() + 60
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    sps.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
