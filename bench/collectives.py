"""What ``--secure`` costs the workers' collectives: the CURVE group against gloo.

``sparseps bench collectives``: two worker processes on this machine meet on a CURVE
rendezvous store and form both groups a job can have: gloo (a plain job's) and the CURVE
group (a ``--secure`` job's, :mod:`sparseps.runtime.curve_group`). They time the same
collectives on each, the two groups taking turns within every round (so both see the
same load on a shared machine), at the sizes sparseps sends:

- ``dense_sync``: sync mode's all-reduce of the dense gradients, every step (the demo's
  wide&deep, 400-400-400 MLP: 410,015 float32, 1.6 MB);
- ``sparse_sync``: sync mode's all-gather of one step's packed sparse gradients (batch
  512, 26 slots: about 12,500 keys x 48 bytes = 600 KB per worker);
- ``metric_buckets``: ``CTRMetrics.compute(global_=True)``'s all-reduce (two 2**20-bucket
  int64 histograms and the sums: 16 MiB), once per pass and evaluation;
- ``barrier``: the trainer's barriers (no payload: the round trip).

Records ``secure_<case>_ms``: rank 0's median time of one collective on the CURVE group,
baseline gloo's in the same run; ``params`` hold the payload and both medians.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from sparseps.benchmarking import BenchRecord

CASES = {  # name: (collective, elements, dtype name)
    "dense_sync": ("all_reduce", 410_015, "float32"),
    "sparse_sync": ("all_gather", 600_000, "uint8"),
    "metric_buckets": ("all_reduce", 2 * 2**20 + 11, "int64"),
    "barrier": ("barrier", 0, "uint8"),
}
ROUNDS, QUICK_ROUNDS = 30, 8


def run(quick: bool = False) -> list[BenchRecord]:
    from sparseps.rpc.security import write_job_keys
    from sparseps.rpc.transport import free_port
    from sparseps.testing.environ import clean_environ

    rounds = QUICK_ROUNDS if quick else ROUNDS
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-collectives-") as folder:
        keys = Path(folder) / "keys"
        write_job_keys(keys)
        master = f"127.0.0.1:{free_port()}"
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "worker",
                    str(rank),
                    master,
                    str(keys),
                    folder,
                    str(rounds),
                ],
                env=clean_environ(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
            for rank in (1, 0)
        ]
        outputs = [p.communicate(timeout=900)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("bench collectives: a worker failed:\n" + "\n".join(outputs))
        times = json.loads((Path(folder) / "times.json").read_text())
    records = []
    for name, (op, elements, dtype) in CASES.items():
        secure = statistics.median(times[name]["curve"]) * 1e3
        plain = statistics.median(times[name]["gloo"]) * 1e3
        nbytes = elements * {"float32": 4, "int64": 8, "uint8": 1}[dtype]
        params = {"collective": op, "bytes": nbytes, "workers": 2, "rounds": rounds,
                  "secure_ms": round(secure, 3), "gloo_ms": round(plain, 3)}  # fmt: skip
        records.append(BenchRecord(f"secure_{name}_ms", secure, "ms", plain, params))
    return records


def _worker(rank: int, master: str, key_dir: str, folder: str, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from sparseps.env import Role, RoleEnv
    from sparseps.runtime.rendezvous import (
        connect_store,
        group_options,
        store_barrier,
        worker_backend,
    )

    env = RoleEnv(role=Role.WORKER, rank=rank, servers=("127.0.0.1:1",), worker_num=2,
                  master=master, log_dir=folder, job_id="bench", key_dir=key_dir)  # fmt: skip
    store = connect_store(env, timeout_s=60, setting="bench")
    store_barrier(store, "bench", rank=rank, world=2, timeout_s=60, warn_s=60, address=master)
    dist.init_process_group("gloo", store=dist.PrefixStore("bench", store), rank=rank,
                            world_size=2, timeout=timedelta(seconds=120))  # fmt: skip
    groups = {
        "gloo": dist.group.WORLD,
        "curve": dist.new_group(backend=worker_backend(env), pg_options=group_options(env)),
    }
    times: dict[str, dict[str, list[float]]] = {}
    for name, (op, elements, dtype) in CASES.items():
        tensor = torch.ones(elements, dtype=getattr(torch, dtype))
        gathered = [torch.empty_like(tensor) for _ in range(2)]
        times[name] = {"gloo": [], "curve": []}
        for r in range(rounds + 1):  # the first round warms up
            order = ("gloo", "curve") if r % 2 else ("curve", "gloo")
            for backend in order:
                group = groups[backend]
                dist.barrier(group=group)
                start = time.perf_counter()
                if op == "all_reduce":
                    dist.all_reduce(tensor, group=group)
                elif op == "all_gather":
                    dist.all_gather(gathered, tensor, group=group)
                else:
                    dist.barrier(group=group)
                if r:
                    times[name][backend].append(time.perf_counter() - start)
    if rank == 0:
        (Path(folder) / "times.json").write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
