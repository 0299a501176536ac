"""One worker of tests/security/test_secure_group.py (run as a script).

Usage: ``group_worker.py MODE RANK WORLD MASTER KEY_DIR OUT [GROUP_KEY_DIR]``. The worker
meets the others on a CURVE rendezvous store (the job's keys in KEY_DIR) and forms the
secure worker group the way ``sps.init()`` does (a ``WorkerGroup`` given the role); with
GROUP_KEY_DIR its group presents those keys instead (a worker of another job). Modes:

- ``join``: only forms the group; the error, if any, goes to OUT/result.RANK.json.
- ``phases`` (three workers): the other checks one after the other on the same processes
  (a worker costs seconds of CPU before its first collective, torch's import, and a
  group forms in milliseconds), each phase on a group of its own on the same store.
  Every phase's record goes into OUT/result.RANK.json, written again after each phase:

  1. ``ops``: a group formed as ``sps.init()`` forms it; every collective sparseps and
     torch offer, on inputs drawn from ``seed = rank``; the results go to
     OUT/result.RANK.npz for the test to check against an oracle.
  2. ``environ``: the group re-formed as an online job's regroup does (a ``WorkerGroup``
     with no role: the keys and the interface come from this process's ``SPARSEPS_*``
     variables), then one all-reduce. Rank 2 then leaves and exits 0: the phases below
     are about a pair, ranks 0 and 1, each on a group of two formed as in 1.
  3. ``late``: rank 0 waits at a barrier (timeout 2 s) that rank 1 never reaches, records
     the error, then tries one more collective; rank 1 goes on once rank 0 recorded it.
  4. ``leave`` / ``crash``: one all-reduce; once rank 0 has it, rank 1 shuts its group
     down (and goes on to the next phase) or dies (``os._exit(3)``), while rank 0 waits
     in a second all-reduce; rank 0 records the error and how long it waited.

The ranks tell each other where they are through keys on the store (its ``wait`` returns
when the key is set).
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
from sparseps.runtime.rendezvous import connect_store, group_options, store_barrier
from sparseps.runtime.worker_group import WorkerGroup

SIZES = (10, 50_000)  # float32: under and over curve_group.SMALL_BYTES
_WAIT = datetime.timedelta(seconds=60)  # a rank waiting for another's step


def _join(env: RoleEnv, group_key_dir: str) -> None:
    """Form the group as ``sps.init()`` does; with ``group_key_dir`` presenting its keys."""
    from sparseps.runtime.rendezvous import worker_backend

    if not group_key_dir:
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
    from sparseps.metrics import distributed as metrics_dist  # numba: this phase only

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


def _environ(env: RoleEnv) -> dict:
    os.environ.update(env.to_environ())  # as in a launched job's worker
    WorkerGroup(timeout_s=30).reform(_store, rank=env.rank, world=env.worker_num,
                                     prefix="online/group/1")  # fmt: skip
    total = collectives.all_reduce_sum(np.array([env.rank + 1]), timeout=30)
    return {"backend": dist.get_backend(), "sum": total.tolist()}


def _late(rank: int) -> dict:
    record: dict = {}
    if rank == 1:
        _store.wait(["late/recorded"], _WAIT)
        return record
    start = time.monotonic()
    for attempt in ("error", "after"):
        try:
            collectives.barrier(timeout=2)
        except Exception as exc:
            record[attempt] = f"{type(exc).__name__}: {exc}"
        record[f"{attempt}_s"] = time.monotonic() - start
    return record


def _peer_gone(rank: int, phase: str) -> dict:
    """``leave`` / ``crash`` (module docstring); rank 1 returns only from ``leave``."""
    collectives.all_reduce_sum(np.ones(3), timeout=30)
    if rank == 1:
        # a crash right after a collective may lose its last message on the way (the
        # peer then fails that collective instead of the next): wait for rank 0 first
        _store.wait([f"{phase}/first"], _WAIT)
        if phase == "crash":
            _exit(3)
        dist.destroy_process_group()
        return {}
    _store.set(f"{phase}/first", "1")
    record: dict = {}
    start = time.monotonic()
    try:
        collectives.all_reduce_sum(np.ones(3), timeout=120)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["waited_s"] = time.monotonic() - start
    return record


def _phases(env: RoleEnv, folder: Path) -> None:
    rank, record = env.rank, {"rank": env.rank}
    result = folder / f"result.{rank}.json"
    WorkerGroup(timeout_s=30, env=env).form(_store, rank=rank, world=env.worker_num,
                                            prefix="sparseps/group")  # fmt: skip
    record["backend"] = dist.get_backend()
    np.savez(folder / f"result.{rank}.npz", **_ops(rank, env.worker_num))
    result.write_text(json.dumps(record))
    record["environ"] = _environ(env)
    result.write_text(json.dumps(record))
    pair = WorkerGroup(timeout_s=30, env=env)
    if rank == 2:
        pair.leave()
        return
    for phase in ("late", "leave", "crash"):
        pair.reform(_store, rank=rank, world=2, prefix=f"pair/{phase}")
        record[phase] = _late(rank) if phase == "late" else _peer_gone(rank, phase)
        result.write_text(json.dumps(record))
        if phase == "late" and rank == 0:
            _store.set("late/recorded", "1")
    pair.leave()


def _exit(code: int) -> None:
    # skips the interpreter's teardown (~1 CPU-s freeing torch's objects): the records
    # are written and the group is shut down (or, for a crash, deliberately is not). Not
    # in ``join``: there each rank exits as a worker whose set-up failed does
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> int:
    global _store
    mode, rank, world, master, key_dir, out = sys.argv[1:7]
    group_key_dir = sys.argv[7] if len(sys.argv) > 7 else ""
    rank, world, folder = int(rank), int(world), Path(out)
    env = RoleEnv(role=Role.WORKER, rank=rank, servers=("127.0.0.1:1",), worker_num=world,
                  master=master, log_dir=out, job_id="group-test", key_dir=key_dir)  # fmt: skip
    _store = connect_store(env, timeout_s=30, setting="S")
    store_barrier(_store, "start", rank=rank, world=world, timeout_s=30, warn_s=30, address=master)
    if mode == "phases":
        _phases(env, folder)
        _exit(0)
    record: dict = {"rank": rank}
    try:
        _join(env, group_key_dir)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    else:
        dist.destroy_process_group()
    (folder / f"result.{rank}.json").write_text(json.dumps(record))
    return 0


_store = None

if __name__ == "__main__":
    sys.exit(main())
