"""A job script for the launcher tests: ``job.py MODE --dir DIR``.

Every role runs it (fleetrun semantics). Modes, on the workers:

- ``fail``: worker 1 exits with code 3 after joining; worker 0 sleeps (to be stopped).
- ``sleep``: every worker sleeps (the test signals the launcher).
- ``restart``: worker 1's first attempt exits 7 before joining (a marker file in DIR
  remembers it); the second attempt joins and both meet at a barrier.
- ``barrier``: worker 0 waits at a barrier that worker 1 never reaches, records the
  timeout error in DIR/barrier.json, then releases worker 1.
- ``late``: a resumable job of ``ROUNDS`` rounds; each round starts at a barrier, checks
  a gloo all-reduce, pushes ``(rank + 1) * [1, 2, 3, 4]`` to every key and records the
  rounds done in DIR/progress (the job's "checkpoint"). In the first generation
  (``SPARSEPS_RESTART_COUNT=0``) worker 1 exits 7 after round 0, long after the gloo group
  formed; a restarted generation resumes at the recorded round. Each worker writes
  DIR/worker.R.json (rows before/after, the rounds it ran, its restart count).
- ``pull``: every worker pulls from the servers in a loop (each pull waits up to the
  client's RPC timeout) for up to 120 s, after writing DIR/pulling.R; a dead server
  makes a pull wait out that timeout.
- ``stop-server``: like ``pull``, but worker 0 first asks server 0 to stop: the server
  exits 0 by itself, long before the workers are done (DIR/stopping is written first).
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

ROUNDS = 3
KEYS = [1, 7, 42, 2**33 + 5, 2**63 + 11, 2**64 - 1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode", choices=["fail", "sleep", "restart", "barrier", "late", "pull", "stop-server"]
    )
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
    role = sps.init()
    if sps.is_server():
        sps.run_server()
        return 0
    rank = sps.worker_index()
    print(f"worker {rank} ready", flush=True)
    if args.mode == "late":
        return late(folder, rank, role.restart_count)
    if args.mode in ("pull", "stop-server"):
        return pull(folder, rank, stop_server=args.mode == "stop-server")
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
            except sps.DeadlineError as exc:
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


def late(folder: Path, rank: int, restart: int) -> int:
    import numpy as np
    import torch
    import torch.distributed as dist

    keys = np.array(KEYS, dtype=np.uint64)
    grads = np.tile((rank + 1) * np.arange(1, 5, dtype=np.float32), (len(keys), 1))
    progress, before_file = folder / "progress", folder / f"before.{rank}.json"
    done = int(progress.read_text()) if progress.exists() else 0
    ran, sums = [], []
    with sps.PSClient(sps.server_endpoints(), timeout=60) as client:
        client.create_table(sps.TableConfig(name="emb", dim=4, rule=sps.optim.SGD(lr=0.5)))
        if done == 0:  # nothing pushed yet: the initial rows
            before_file.write_text(json.dumps(client.pull("emb", keys).wait().tolist()))
        for r in range(done, ROUNDS):
            sps.barrier_worker(timeout=60)  # a store barrier: a lost peer is waited for, named
            total = torch.tensor([rank + 1.0])
            dist.all_reduce(total)  # the gloo group of this generation works
            sums.append(total.item())
            client.push("emb", keys, grads).wait()
            sps.barrier_worker(timeout=60)  # every push of round r is applied
            if rank == 0:
                progress.write_text(str(r + 1))
            sps.barrier_worker(timeout=60)
            ran.append(r)
            if rank == 1 and restart == 0 and r == 0:
                print("worker 1: failing after round 0 on purpose", flush=True)
                return 7
        after = client.pull("emb", keys).wait().tolist()
    record = {"rank": rank, "restart": restart, "ran": ran, "sums": sums,
              "before": json.loads(before_file.read_text()), "after": after}  # fmt: skip
    (folder / f"worker.{rank}.json").write_text(json.dumps(record))
    sps.stop()
    return 0


def pull(folder: Path, rank: int, *, stop_server: bool) -> int:
    import numpy as np

    keys = np.array(KEYS, dtype=np.uint64)
    with sps.PSClient(sps.server_endpoints()) as client:  # SPARSEPS_RPC_TIMEOUT applies
        client.create_table(sps.TableConfig(name="emb", dim=4, rule=sps.optim.SGD(lr=0.5)))
        if stop_server and rank == 0:
            (folder / "stopping").write_text(str(os.getpid()))
            client.stop_servers(ranks=[0])
            print("worker 0: asked server 0 to stop", flush=True)
        (folder / f"pulling.{rank}").write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            client.pull("emb", keys).wait()
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
