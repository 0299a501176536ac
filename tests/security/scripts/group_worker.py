"""One worker of tests/security/test_secure_group.py (run as a script).

Usage: ``group_worker.py MODE RANK WORLD MASTER KEY_DIR OUT [GROUP_KEY_DIR]``. The worker
meets the others on a CURVE rendezvous store (the job's keys in KEY_DIR) and forms the
secure worker group the way ``sps.init()`` does (a ``WorkerGroup`` given the role); with
GROUP_KEY_DIR its group presents those keys instead (a worker of another job). Modes:

- ``ops``: every collective sparseps and torch offer, on inputs drawn from ``seed =
  rank``; the results go to OUT/result.RANK.npz for the test to check against an oracle.
- ``join``: only forms the group; the error, if any, goes to OUT/result.RANK.json.
- ``environ``: forms the group as an online job's regroup does (a ``WorkerGroup`` with no
  role: the keys and the interface come from this process's ``SPARSEPS_*`` variables),
  then one all-reduce.
- ``crash`` / ``leave``: one all-reduce; once rank 0 has it (OUT/first.0), rank 1 dies
  (``os._exit``) or shuts its group down and exits 0, while rank 0 waits in a second
  all-reduce; rank 0 records the error and how long it waited.
- ``late``: rank 0 waits at a barrier (timeout 2 s) that rank 1 never reaches, records
  the error, then tries one more collective; rank 1 exits once rank 0 recorded it.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from sparseps.core import collectives
from sparseps.env import Role, RoleEnv
from sparseps.metrics import distributed as metrics_dist
from sparseps.runtime.rendezvous import connect_store, group_options, store_barrier

SIZES = (10, 50_000)  # float32: under and over curve_group.SMALL_BYTES


def _form_group(env: RoleEnv, group_key_dir: str, mode: str) -> None:
    from sparseps.runtime.rendezvous import worker_backend
    from sparseps.runtime.worker_group import WorkerGroup

    if mode == "environ":  # as an online job's membership re-forms it: the role from os.environ
        os.environ.update(env.to_environ())
        WorkerGroup(timeout_s=30).reform(_store, rank=env.rank, world=env.worker_num,
                                         prefix="online/group/1")  # fmt: skip
        return

    if not group_key_dir:  # as sps.init() forms it
        WorkerGroup(timeout_s=30, env=env).form(_store, rank=env.rank, world=env.worker_num,
                                                prefix="sparseps/group")  # fmt: skip
        return
    other = RoleEnv(**{**env.__dict__, "key_dir": group_key_dir})
    dist.init_process_group(
        backend=worker_backend(env), store=dist.PrefixStore("sparseps/group", _store),
        rank=env.rank, world_size=env.worker_num, timeout=datetime.timedelta(seconds=30),
        pg_options=group_options(other),
    )  # fmt: skip


def _ops(rank: int, world: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rank)
    out: dict[str, np.ndarray] = {}
    for n in SIZES:
        t = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
        dist.all_reduce(t)
        out[f"sum_{n}"] = t.numpy()
    t = torch.tensor([rank, -rank, 7], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["max"] = t.numpy()
    t = torch.tensor([rank, -rank, 7], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    out["min"] = t.numpy()
    out["metrics_sum"] = metrics_dist.all_reduce_sum(
        rng.integers(0, 1 << 40, 100_000), timeout=30
    )  # the metrics' int64 buckets
    out["dense_sum"] = collectives.all_reduce_sum(
        rng.standard_normal(30_000), timeout=30
    )  # sync mode's dense gradients (float64 here)
    out["broadcast"] = collectives.broadcast_array(np.full(5, rank, np.int64), src=world - 1)
    param = torch.nn.Parameter(torch.full((3,), float(rank)))  # a leaf that requires grad
    dist.broadcast(param, src=1)
    out["param_broadcast"] = param.detach().numpy()
    rows = (np.arange(rank * 5 * 2, dtype=np.uint64) + (np.uint64(1) << np.uint64(63))).reshape(
        -1, 2
    )
    out["gathered"] = np.concatenate(collectives.all_gather_arrays(rows, timeout=30))
    counts = np.array([(rank + j) % 3 for j in range(world)], np.int64)  # zeros included
    sent = np.repeat(np.arange(world, dtype=np.int64) + 10 * rank, counts)
    got, got_counts = collectives.all_to_all_rows(sent, counts, timeout=30)
    out["all_to_all"], out["all_to_all_counts"] = got, got_counts
    metric_rows = np.full((rank, 3), rank, np.int64)
    out["gather_rows"] = metrics_dist.all_gather_rows(metric_rows, timeout=30)
    collectives.barrier(timeout=30)
    # point to point: receives posted before the sends (odd ranks) and after (even)
    payloads = {p: torch.full((p + 1,), rank, dtype=torch.uint8) for p in range(world)}
    buffers = {p: torch.empty(rank + 1, dtype=torch.uint8) for p in range(world) if p != rank}
    works = []
    if rank % 2:
        works += [dist.irecv(buffers[p], src=p) for p in buffers]
    works += [dist.isend(payloads[p], dst=p) for p in buffers]
    if not rank % 2:
        dist.barrier()  # the peers' messages are held before the receive is posted
        works += [dist.irecv(buffers[p], src=p) for p in buffers]
    else:
        dist.barrier()
    for work in works:
        work.wait(datetime.timedelta(seconds=30))
    out["p2p"] = np.array([int(buffers[p][0]) if p != rank else -1 for p in range(world)])
    objects: list = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    out["objects"] = np.array([o["rank"] for o in objects])
    out["counts_all_reduce"] = np.array(collectives.counts().get("all_reduce", 0))
    return out


def _wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> int:
    global _store
    mode, rank, world, master, key_dir, out = sys.argv[1:7]
    group_key_dir = sys.argv[7] if len(sys.argv) > 7 else ""
    rank, world, folder = int(rank), int(world), Path(out)
    env = RoleEnv(role=Role.WORKER, rank=rank, servers=("127.0.0.1:1",), worker_num=world,
                  master=master, log_dir=out, job_id="group-test", key_dir=key_dir)  # fmt: skip
    _store = connect_store(env, timeout_s=30, setting="S")
    store_barrier(_store, "start", rank=rank, world=world, timeout_s=30, warn_s=30, address=master)
    record: dict = {"rank": rank}
    try:
        _form_group(env, group_key_dir, mode)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        (folder / f"result.{rank}.json").write_text(json.dumps(record))
        return 0
    record["backend"] = dist.get_backend()
    if mode == "ops":
        np.savez(folder / f"result.{rank}.npz", **_ops(rank, world))
    elif mode == "environ":
        record["sum"] = collectives.all_reduce_sum(np.array([rank + 1]), timeout=30).tolist()
    elif mode in ("crash", "leave"):
        collectives.all_reduce_sum(np.ones(3), timeout=30)
        if rank == 1:
            # a crash right after a collective may lose its last message on the way (the
            # peer then fails that collective instead of the next): wait for rank 0 first
            _wait_for(folder / "first.0", 60)
            if mode == "crash":
                os._exit(3)
            dist.destroy_process_group()
            return 0
        (folder / "first.0").write_text("1")
        start = time.monotonic()
        try:
            collectives.all_reduce_sum(np.ones(3), timeout=120)
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
        record["waited_s"] = time.monotonic() - start
    elif mode == "late":
        if rank == 1:
            _wait_for(folder / "result.0.json", 60)
            return 0
        start = time.monotonic()
        for attempt in ("error", "after"):
            try:
                collectives.barrier(timeout=2)
            except Exception as exc:
                record[attempt] = f"{type(exc).__name__}: {exc}"
            record[f"{attempt}_s"] = time.monotonic() - start
    (folder / f"result.{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    return 0


_store = None

if __name__ == "__main__":
    sys.exit(main())
