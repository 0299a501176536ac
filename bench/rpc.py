"""Pull/push through real servers on loopback vs. the same calls on an in-process table.

For 1 and 2 server processes: rows/s of pulls and pushes of 8192-key batches (dim 16,
Adagrad) with several requests in flight, and the p50/p99 latency of single pulls. Each
figure's baseline is the same operation on an in-process ``SparseTable`` holding the
same rows, measured in the same run, interleaved with the rpc figures round by round
(best of the rounds for each: noise on a shared machine only ever slows things down).
``ratio`` = rpc / in-process; for latencies a ratio above 1 means slower. The pushes
keep changing the rows of both tables the same way, so both keep equal contents.

Each side's timed block starts warm: ``WARM_S`` seconds of its own untimed operations
first. On a 2-core VM the in-process pulls keep one CPU busy and leave the other idle,
and the first ~150 rpc pulls after such a block run up to 1.5x slower than later ones
(~720 -> ~480 us a pull) while the in-process pulls show no such ramp; keeping the idle
CPU busy with a spinning process during the in-process block (stopped before the rpc
block) removed most of the ramp (bench/RESULTS.md, 2026-11-28), which points at the
idle CPU waking up (the host's scheduling or clock of that vCPU), not at the server. The
first block after the in-process one is still reported, ``rpc_pull_cold_rows_per_s``:
what a server that sat idle sees on such a machine.

``rpc_pull_paired_ratio`` is the median over the rounds of each round's own ratio (its rpc
pulls / its in-process pulls, run back to back): a round of either side swings by 1.6x on
a shared 2-vCPU VM, and a best-of-rounds ratio moves with the one luckiest round of each
side (0.69-0.92 over five runs of one quiet hour, bench/RESULTS.md 2026-11-29), while
each round's two blocks see the same load.

The clients use reply slots (``PSClient(reply_slots=8)``, the default: the server on this
host gathers each pull's rows into the client's shared memory, :mod:`sparseps.rpc.reply_slots`).
With 1 server, a second client with ``reply_slots=0`` (answers over loopback TCP) is
measured in the same rounds, each of its blocks paired with an in-process block of its
own (``rpc_socket_pull_paired_ratio``), and its single pulls' latency
(``rpc_socket_pull_p50_ms``): what the slots buy.

``rpc_pull_steady_rows_per_s`` measures the same pipelined pulls in steady state: each
side runs 1000 pulls back to back (200 with ``--quick``), each block after its warm-up,
best of 2.

``rpc_small_pull_per_s`` (1 server) measures what a request costs besides its op: 1-key
pulls, 8 in flight, against 1-key pulls on the in-process table (each side's pulls back
to back, best of 2); ``rpc_small_pull_server_cpu_us`` is the server process's CPU per
such request (all its threads, from ``/proc/PID/stat``; no baseline).

With ``--secure`` the same servers run a second time with CURVE transport (fresh job keys,
servers started from the launcher's environment as in a ``--secure`` job), measured in the
same rounds, and ``rpc_secure_*`` records give secure / plain (the plain rpc figure is
their baseline): the cost of encryption on loopback.

With ``--replicas R`` it measures replication instead: the same pipelined pulls and pushes
against ``max(3, R + 1)`` servers keeping R backup copies of every shard, with the same
servers without copies as the baseline (``rpc_replicated_*``, interleaved rounds), and
the failover time (``rpc_failover_s``): one server of the replicated cluster is killed
with SIGKILL while a client keeps pushing; the figure is the time from the kill to the
end of the first push sent after it (the client has noticed the loss and routed around it),
and the re-replication time (``rpc_rereplication_s``): a replacement server starts on the
lost rank and copies its shards from the survivors while the client keeps pushing, until
the client writes to it again.

Run: ``sparseps bench rpc [--quick] [--secure | --replicas R] [--json]``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sparseps import env, optim
from sparseps.benchmarking import BenchRecord
from sparseps.config import TableConfig
from sparseps.errors import SparsePSError
from sparseps.rpc.client import PSClient
from sparseps.rpc.security import JobKeys, Security, write_job_keys
from sparseps.rpc.transport import free_port
from sparseps.table import SparseTable
from sparseps.testing import local_cluster

BATCH = 8192
DIM = 16
IN_FLIGHT = 4
STEADY_PULLS, QUICK_STEADY_PULLS = 1000, 200
# Interleaved rounds: odd, so the median paired ratio is one round's own.
ROUNDS = 9
# Untimed operations before each side's timed block (module docstring: the idle CPU).
WARM_S = 0.3
# Small requests: the per-request cost of the protocol, the server's loop and the client.
SMALL_PULLS, QUICK_SMALL_PULLS, SMALL_IN_FLIGHT = 3000, 500, 8


def _config() -> TableConfig:
    return TableConfig(name="bench", dim=DIM, rule=optim.Adagrad(lr=0.05), seed=1)


def _batches(universe: np.ndarray, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [universe[rng.integers(0, len(universe), BATCH)] for _ in range(count)]


def _fill(push, universe: np.ndarray) -> None:
    grads = np.full((BATCH, DIM), 0.01, np.float32)
    for start in range(0, len(universe), BATCH):
        keys = universe[start : start + BATCH]
        push(keys, grads[: len(keys)])


def _pipelined(issue, batches: list, depth: int) -> float:
    """Seconds to run every batch with up to ``depth`` handles outstanding."""
    start = time.perf_counter()
    handles = []
    for keys in batches:
        handles.append(issue(keys))
        if len(handles) >= depth:
            handles.pop(0).wait()
    for handle in handles:
        handle.wait()
    return time.perf_counter() - start


def _warm(call, batches: list, seconds: float = WARM_S) -> None:
    """Run ``call`` over ``batches`` (again and again) for ``seconds``, untimed."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for keys in batches:
            call(keys)


def _latencies(call, batches: list) -> np.ndarray:
    times = []
    for keys in batches:
        start = time.perf_counter()
        call(keys)
        times.append(time.perf_counter() - start)
    return np.array(times) * 1e3


class _Local:
    """The baseline: the same calls on an in-process table holding the same rows."""

    def __init__(self, universe: np.ndarray) -> None:
        self.table = SparseTable(_config())
        _fill(self.table.push, universe)

    def measure(self, pulls, pushes, grads) -> dict:
        table = self.table
        _warm(table.pull, pulls)
        start = time.perf_counter()
        for keys in pulls:
            table.pull(keys)
        pull_s = time.perf_counter() - start
        start = time.perf_counter()
        for keys in pushes:
            table.push(keys, grads)
        push_s = time.perf_counter() - start
        latency = _latencies(table.pull, pulls)
        return _figures(len(pulls), pull_s, len(pushes), push_s, latency)


def _figures(pulls: int, pull_s: float, pushes: int, push_s: float, latency: np.ndarray) -> dict:
    p50, p99 = np.percentile(latency, [50, 99])
    return {"pull": pulls * BATCH / pull_s, "push": pushes * BATCH / push_s, "p50": p50, "p99": p99}


def _measure_remote(client, pulls, pushes, grads) -> dict:
    """The rpc figures of one round, and ``cold``: rows/s of the first pulls of the round
    (after 3 untimed ones), before the warm-up (module docstring)."""

    def issue(keys):
        return client.pull("bench", keys)

    for keys in pulls[:3]:  # connections and the servers' kernels warm
        issue(keys).wait()
    cold = len(pulls) * BATCH / _pipelined(issue, pulls, IN_FLIGHT)
    _warm(lambda batch: _pipelined(issue, batch, IN_FLIGHT), [pulls])
    pull_s = _pipelined(issue, pulls, IN_FLIGHT)
    push_s = _pipelined(lambda k: client.push("bench", k, grads), pushes, IN_FLIGHT)
    latency = _latencies(lambda k: client.pull("bench", k).wait(), pulls)
    return {**_figures(len(pulls), pull_s, len(pushes), push_s, latency), "cold": cold}


def _steady(local: _Local, client, pulls: list, rounds: int = 2) -> tuple[float, float]:
    """Rows/s of pipelined pulls in steady state, ``(rpc, in-process)``: each side's
    pulls back to back in a block of its own after ``WARM_S`` of untimed ones (the
    threads of both processes placed and running), best of ``rounds``."""
    table, remote, base = local.table, [], []

    def issue(keys):
        return client.pull("bench", keys)

    for _ in range(rounds):
        _warm(table.pull, pulls[:10])
        start = time.perf_counter()
        for keys in pulls:
            table.pull(keys)
        base.append(len(pulls) * BATCH / (time.perf_counter() - start))
        _warm(lambda batch: _pipelined(issue, batch, IN_FLIGHT), [pulls[:50]])
        remote.append(len(pulls) * BATCH / _pipelined(issue, pulls, IN_FLIGHT))
    return max(remote), max(base)


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _small(local: _Local, client, server_pid: int, keys: list, rounds: int = 2) -> dict:
    """1-key pulls, ``SMALL_IN_FLIGHT`` in flight: requests/s through the server and the
    server process's CPU per request, against 1-key pulls on the in-process table; best
    of ``rounds`` (each side's pulls back to back)."""
    table, remote, base, cpu = local.table, [], [], []

    def issue(key):
        return client.pull("bench", key)

    for _ in range(rounds):
        start = time.perf_counter()
        for key in keys:
            table.pull(key)
        base.append(len(keys) / (time.perf_counter() - start))
        _pipelined(issue, keys[:100], SMALL_IN_FLIGHT)
        used = _process_cpu_s(server_pid)
        remote.append(len(keys) / _pipelined(issue, keys, SMALL_IN_FLIGHT))
        cpu.append((_process_cpu_s(server_pid) - used) / len(keys))
    return {"rpc": max(remote), "base": max(base), "server_cpu_us": min(cpu) * 1e6}


def _best(results: list[dict]) -> dict:
    """Best of the rounds: highest throughput, lowest latency (noise only ever slows down)."""
    best = {"cold": max(r["cold"] for r in results)} if "cold" in results[0] else {}
    return {
        **best,
        "pull": max(r["pull"] for r in results),
        "push": max(r["push"] for r in results),
        "p50": min(r["p50"] for r in results),
        "p99": min(r["p99"] for r in results),
    }


def _paired_ratio(remote: list[dict], base: list[dict]) -> float:
    """The median over rounds of each round's rpc pull rate / its in-process pull rate."""
    return float(np.median([r["pull"] / b["pull"] for r, b in zip(remote, base, strict=True)]))


def _socket_records(on_socket: list, paired: float | None, base: Any, params: dict) -> list:
    """The 1-server client without reply slots: its paired ratio (no baseline) and its
    pull latency (baseline: the in-process pull's, as ``rpc_pull_p50_ms``)."""
    if not on_socket or paired is None:
        return []
    params = {**params, "reply_slots": 0}
    p50 = float(_best(on_socket)["p50"])
    return [
        BenchRecord("rpc_socket_pull_paired_ratio", paired, "ratio", None,
                    {**params, "statistic": "as rpc_pull_paired_ratio"}),
        BenchRecord("rpc_socket_pull_p50_ms", p50, "ms", float(base["p50"]), params),
    ]  # fmt: skip


_SECURE_JOB = "bench-rpc-secure"


@contextlib.contextmanager
def _secure_client(servers: int, timeout: float = 60.0):
    """``servers`` CURVE servers started as a ``--secure`` job starts them; yields a client."""
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-secure-") as folder:
        key_dir = Path(folder) / "keys"
        write_job_keys(key_dir)
        security = Security(JobKeys.load(key_dir))
        endpoints = [f"127.0.0.1:{free_port()}" for _ in range(servers)]
        code = "import sparseps as sps; sps.init(); sps.run_server()"
        processes = []
        for rank in range(servers):
            role = env.RoleEnv(
                env.Role.SERVER, rank, tuple(endpoints), 1, f"127.0.0.1:{free_port()}",
                folder, _SECURE_JOB, key_dir=str(key_dir),
            )  # fmt: skip
            with open(Path(folder) / f"server.{rank}.log", "wb") as log:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code],
                        env=env.child_environ(role.to_environ()),
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )  # fmt: skip
                )
        try:
            with PSClient(endpoints, timeout=timeout, security=security, job_id=_SECURE_JOB) as c:
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        c.ping(timeout=1.0)
                        break
                    except SparsePSError:
                        if time.monotonic() > deadline or any(
                            p.poll() is not None for p in processes
                        ):
                            raise
                yield c
                c.stop_servers()
        finally:
            for process in processes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _failover_s(cluster, client, universe: np.ndarray, grads: np.ndarray) -> float:
    """Seconds from SIGKILL of server 1 to the end of the first push sent after it."""
    batches = _batches(universe, 8, seed=4)
    for keys in batches:
        client.push("bench", keys, grads).wait()
    killed = time.perf_counter()
    cluster.kill(1)
    client.push("bench", batches[0], grads).wait()
    return time.perf_counter() - killed


def _rereplication_s(cluster, client, universe: np.ndarray, grads: np.ndarray) -> float:
    """Seconds from starting a replacement for the killed server 1 until this client
    writes to it again (it copied its shards while the client kept pushing)."""
    batches = _batches(universe, 4, seed=5)
    started = time.perf_counter()
    cluster.replace(1)
    for step in range(100_000):
        client.push("bench", batches[step % len(batches)], grads).wait()
        if 1 in client.views.members(1) and 1 in client.views.members(0):
            return time.perf_counter() - started
        if time.perf_counter() - started > 300:
            break
    raise SparsePSError("bench rpc: the replacement server did not join within 300 s")


def _replicated(quick: bool, replicas: int, universe, pulls, pushes, grads) -> list[BenchRecord]:
    servers = max(3, replicas + 1)
    rounds = 2 if quick else 3
    with contextlib.ExitStack() as stack:
        clients = []
        for copies in (0, replicas):
            cluster = stack.enter_context(
                local_cluster(servers=servers, timeout=60, replicas=copies)
            )
            client = stack.enter_context(cluster.client(timeout=120))
            client.create_table(_config())
            _fill(lambda k, g, c=client: c.push("bench", k, g).wait(), universe)
            clients.append(client)
        plain, copied = [], []
        for _ in range(rounds):  # interleaved: both see the same load
            plain.append(_measure_remote(clients[0], pulls, pushes, grads))
            copied.append(_measure_remote(clients[1], pulls, pushes, grads))
        failover = _failover_s(cluster, clients[1], universe, grads)
        rejoin = _rereplication_s(cluster, clients[1], universe, grads)
    plain, copied = _best(plain), _best(copied)
    params = {
        "servers": servers, "replicas": replicas, "batch": BATCH, "dim": DIM,
        "in_flight": IN_FLIGHT, "rows": len(universe), "rounds": rounds,
        "baseline": "the same servers without replicas, same run",
    }  # fmt: skip
    return [
        *(
            BenchRecord(
                f"rpc_replicated_{name}", float(copied[key]), unit, float(plain[key]), params
            )
            for name, key, unit in (
                ("pull_rows_per_s", "pull", "rows/s"),
                ("push_rows_per_s", "push", "rows/s"),
                ("pull_p50_ms", "p50", "ms"),
            )
        ),
        BenchRecord("rpc_failover_s", failover, "s", None, {**params, "killed": "server 1"}),
        # the replacement copies shards 1 and 0: about 2/3 of the rows (with the start-up)
        BenchRecord(
            "rpc_rereplication_s",
            rejoin,
            "s",
            None,
            {
                **params,
                "copied_rows": int(len(universe) * 2 / servers),
                "includes": "process start",
            },
        ),  # fmt: skip
    ]


def run(quick: bool, secure: bool = False, replicas: int = 0) -> list[BenchRecord]:
    if secure and replicas:
        raise SparsePSError("bench rpc: --secure and --replicas are measured in separate runs")
    rows = 100_000 if quick else 1_000_000
    count = 20 if quick else 100
    rounds = 2 if quick else ROUNDS
    universe = np.random.default_rng(0).choice(2**62, rows, replace=False).astype(np.uint64)
    pulls = _batches(universe, count, seed=1)
    pushes = _batches(universe, count, seed=2)
    steady_pulls = _batches(universe, QUICK_STEADY_PULLS if quick else STEADY_PULLS, seed=4)
    small_pulls = [universe[i : i + 1] for i in range(QUICK_SMALL_PULLS if quick else SMALL_PULLS)]
    grads = np.random.default_rng(3).standard_normal((BATCH, DIM)).astype(np.float32) * 0.01
    if replicas:
        return _replicated(quick, replicas, universe, pulls, pushes, grads)
    local = _Local(universe)
    records = []
    for servers in (1, 2):
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(local_cluster(servers=servers, timeout=60))
            client = stack.enter_context(cluster.client(timeout=120))
            # 1 server: also a client without reply slots (its answers over loopback TCP)
            if servers == 1:
                wire = stack.enter_context(cluster.client(timeout=120, reply_slots=0))
            clients = [client]
            if secure:
                clients.append(stack.enter_context(_secure_client(servers)))
            for c in clients:
                c.create_table(_config())
                _fill(lambda k, g, c=c: c.push("bench", k, g).wait(), universe)
            # Rounds interleave baseline, rpc (and secure rpc) so all see the same load.
            base, remote, curve, on_socket = [], [], [], []
            for _ in range(rounds):
                base.append(local.measure(pulls, pushes, grads))
                remote.append(_measure_remote(client, pulls, pushes, grads))
                if servers == 1:
                    base.append(local.measure(pulls, pushes, grads))
                    on_socket.append(_measure_remote(wire, pulls, pushes, grads))
                if secure:
                    curve.append(_measure_remote(clients[1], pulls, pushes, grads))
            steady, steady_base = _steady(local, client, steady_pulls)
            if servers == 1:
                small = _small(local, client, cluster.pid(0), small_pulls)
        paired = _paired_ratio(remote, base[:: 1 + bool(on_socket)])
        socket_paired = _paired_ratio(on_socket, base[1::2]) if on_socket else None
        base, remote = _best(base), _best(remote)
        params = {
            "servers": servers,
            "batch": BATCH,
            "dim": DIM,
            "in_flight": IN_FLIGHT,
            "batches": count,
            "rows": rows,
            "rounds": rounds,
        }
        records += [
            BenchRecord("rpc_pull_rows_per_s", remote["pull"], "rows/s", base["pull"], params),
            BenchRecord(
                "rpc_pull_cold_rows_per_s",
                remote["cold"],
                "rows/s",
                base["pull"],
                {**params, "order": "the round's first pulls, before the warm-up"},
            ),
            # no baseline: the ratio itself, of the two blocks of each round (module docstring)
            BenchRecord(
                "rpc_pull_paired_ratio",
                paired,
                "ratio",
                None,
                {**params, "statistic": "median over rounds of rpc / in-process"},
            ),
            *_socket_records(on_socket, socket_paired, base, params),
            BenchRecord("rpc_push_rows_per_s", remote["push"], "rows/s", base["push"], params),
            BenchRecord("rpc_pull_p50_ms", float(remote["p50"]), "ms", float(base["p50"]), params),
            BenchRecord("rpc_pull_p99_ms", float(remote["p99"]), "ms", float(base["p99"]), params),
            BenchRecord(
                "rpc_pull_steady_rows_per_s",
                steady,
                "rows/s",
                steady_base,
                {
                    **params,
                    "batches": len(steady_pulls),
                    "rounds": 2,
                    "order": "each side's pulls back to back",
                },
            ),
        ]
        if servers == 1:
            small_params = {
                "servers": 1, "batch": 1, "in_flight": SMALL_IN_FLIGHT, "pulls": len(small_pulls),
                "rounds": 2, "order": "each side's pulls back to back",
            }  # fmt: skip
            records += [
                BenchRecord(
                    "rpc_small_pull_per_s", small["rpc"], "pulls/s", small["base"], small_params
                ),
                # no baseline: what one request costs the server process (all its threads)
                BenchRecord(
                    "rpc_small_pull_server_cpu_us", small["server_cpu_us"], "us", None, small_params
                ),
            ]
        if secure:
            curve = _best(curve)
            params = {**params, "transport": "CURVE", "baseline": "plain rpc, same run"}
            records += [
                BenchRecord(
                    f"rpc_secure_{name}", float(curve[key]), unit, float(remote[key]), params
                )
                for name, key, unit in (
                    ("pull_rows_per_s", "pull", "rows/s"),
                    ("push_rows_per_s", "push", "rows/s"),
                    ("pull_p50_ms", "p50", "ms"),
                    ("pull_p99_ms", "p99", "ms"),
                )
            ]
    return records
