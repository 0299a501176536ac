"""Scaling: training samples/s and server CPU per sample against table size, servers, workers.

Real server processes (``local_cluster``) and worker processes that train the demo job's
wide&deep shape in the e2e worker's loop: 26 slots of one dim-8 Adagrad table, 13 dense
features, batch 512, the demo's ``WideDeepHead`` (400-400-400 MLP, Adam, one torch thread
per worker; the wide table is left out), the pull of batch i+1 in flight while batch i
computes and its push goes out asynchronously. Every key of a batch is drawn uniformly
from *all* the rows the table was filled with (keys ``mix64(0..N-1)``), so the working set
spans the whole table; keys are never new, so the table keeps its size.

The table is pre-filled through the servers' bulk path: a generated save (Arrow shard
files written with ``sparseps.files.shards.write_shard``, one file per server per chunk of
rows, with the writer rank and server count a save made on that many servers records) that
``PSClient.load`` imports; the files are deleted once loaded.

Three series, each point one timed window of ``seconds`` (the best of ``rounds``):

1. table size: ``rows`` = 1M, 10M, 100M (``--quick``: 100k, 300k, 1M), 1 server, 1 worker;
2. servers = 1, 2, 4 at the smallest size, with the most workers (4);
3. workers = 1, 2, 4 at the smallest size, on 1 server.

Records per point: ``samples_per_s[SERIES]`` (samples trained by all workers / the window's
wall time), ``server_cpu_us_per_sample[SERIES]`` (utime+stime from ``/proc/PID/stat``
of every server process over the window / samples trained) and
``samples_per_s_per_server_core[SERIES]`` (1e6 / that: the samples one fully busy server
core trains, so a job's server cores = its samples/s / this). The baseline of each is the
first point of its series measured in the same run (1M rows / 1 server / 1 worker for the
table and worker series, 1 server / 4 workers for the server series; ``params.baseline``
says which). Every record's ``params`` holds the machine's CPU count (``cpus``: os.cpu_count,
``cpus_usable``: sched_getaffinity) and a ``note`` saying it, since the figures of a 2-core
box and a 16-core box differ.

Memory: a row takes about 106 bytes in a server (dim 8 + Adagrad state + counters + hash
index), 89 in a shard file: 100M rows need ~11 GB of memory in the server (~14 GB checked
for: the 10M table loaded before is dropped only after the load) and ~9 GB of temporary
disk under ``$TMPDIR``; this process holds one 10M-row chunk (~1.5 GB) while it writes.
A size whose estimate exceeds ``MemAvailable`` (/proc/meminfo) or the free disk, or above
``SPARSEPS_SCALING_MAX_ROWS`` when set, is skipped with a ``skipped[rows]`` record saying
why (and a line on stderr) — never silently.

Duration: the full run is 7 points x 2 rounds of 10 s, plus ~1.5 min to write and load the
100M-row save: ~4-5 min (2 or 16 cores); ``--quick`` (7 windows of 2.5 s) ~40 s on 2 cores.

Hot keys (``--replicas R``, instead of the three series): ``HOT_SERVERS`` = 4 servers
keeping R backup copies of every shard, 2 workers, 1M rows, each key drawn from a Zipf
(``ZIPF_A`` = 1.2) popularity over the rows (row r the r-th most popular, ``mix64(r)`` its
key, so the popular rows land on whichever shards their keys hash to). Windows alternate
between the workers reading every shard at its head and spreading reads over the shard's
live copies (:mod:`sparseps.rpc.shard_views`), on the same cluster, ``max(rounds, 2)``
windows each; ``busiest_server_cpu_us_per_sample[hot spread=off|on]`` is the CPU per sample
of the server that used the most (the lowest window of each), with spread=off as baseline.

Run: ``sparseps bench scaling [--quick] [--replicas R] [--json]``. Workers are this file run as a script
(``python bench/scaling.py --worker RANK``), driven by JSON lines on stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sparseps import optim
from sparseps.benchmarking import BenchRecord
from sparseps.config import TableConfig
from sparseps.core.hashing import mix64_array
from sparseps.core.routing import server_of
from sparseps.errors import ConfigError, SparsePSError
from sparseps.testing import local_cluster

TABLE = "scaling"
DIM, SLOTS, DENSE, BATCH = 8, 26, 13, 512
HIDDEN = (400, 400, 400)
SIZES, QUICK_SIZES = (1_000_000, 10_000_000, 100_000_000), (100_000, 300_000, 1_000_000)
SERVERS = WORKERS = (1, 2, 4)
SECONDS, QUICK_SECONDS = 10.0, 2.5
ROUNDS, QUICK_ROUNDS = 2, 1
CHUNK = 10_000_000  # rows per generated shard file: bounds this process's memory (~1 GB)
ROW_BYTES = 106  # a dim-8 Adagrad row in a server (bench table's bytes_per_row)
FILE_ROW_BYTES = 89  # the same row in a shard file
MAX_ROWS_ENV = "SPARSEPS_SCALING_MAX_ROWS"
# the hot-keys series (--replicas R): Zipf-distributed keys over this many servers
HOT_SERVERS, HOT_WORKERS, HOT_ROWS, ZIPF_A = 4, 2, 1_000_000, 1.2
REPLY_TIMEOUT = 300.0
# today's code against a commit (SPARSEPS_SCALING_AGAINST=REF): 1 server, 2 workers at the
# smallest size, SPARSEPS_SCALING_PAIRS alternating pairs of runs
AGAINST_ENV, PAIRS_ENV, AGAINST_WORKERS = "SPARSEPS_SCALING_AGAINST", "SPARSEPS_SCALING_PAIRS", 2
# SPARSEPS_SCALING_PEER=paddle: the Paddle peer's server CPU per sample beside ours
PEER_ENV, PEER_ROWS, PEER_QUICK_ROWS = "SPARSEPS_SCALING_PEER", 400_000, 100_000
PADDLE_RUN = Path(__file__).resolve().parents[2] / "shared" / "peers" / "paddle" / "run.sh"


def _config() -> TableConfig:
    return TableConfig(name=TABLE, dim=DIM, rule=optim.Adagrad(lr=0.05), seed=1)


def cpu_note() -> dict:
    """The machine's CPU count, for every record (2-core and 16-core figures differ)."""
    cpus = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    return {
        "cpus": cpus,
        "cpus_usable": usable,
        "note": f"measured on a machine with {cpus} CPUs ({usable} usable by this process)",
    }


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads) from ``/proc/PID/stat``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SparsePSError("bench scaling: /proc/meminfo has no MemAvailable line")


def _skip_reason(rows: int, loaded_rows: int, folder: Path) -> str | None:
    """Why ``rows`` cannot be measured here, or None."""
    cap = os.environ.get(MAX_ROWS_ENV)
    if cap and not cap.isdigit():
        raise ConfigError(f"bench scaling: {MAX_ROWS_ENV} must be a row count, got {cap!r}")
    if cap and rows > int(cap):
        return f"{MAX_ROWS_ENV}={cap}"
    # the load builds the new table beside the one loaded before, then drops that one
    need = int((rows + loaded_rows) * ROW_BYTES * 1.2) + (1 << 30)
    available = _available_bytes()
    if need > available:
        return (
            f"memory: needs ~{need / 1e9:.1f} GB, MemAvailable is {available / 1e9:.1f} GB "
            f"(set {MAX_ROWS_ENV} to cap the sizes)"
        )
    disk = int(rows * FILE_ROW_BYTES * 1.05)
    free = shutil.disk_usage(folder).free
    if disk > free:
        return f"disk: the generated save needs ~{disk / 1e9:.1f} GB, {folder} has {free / 1e9:.1f} GB free"
    return None


def table_keys(start: int, stop: int) -> np.ndarray:
    """The keys of rows ``start..stop-1`` of a filled table (distinct: mix64 is a bijection)."""
    return mix64_array(np.arange(start, stop, dtype=np.uint64))


def write_filled_save(folder: Path, config: TableConfig, rows: int, servers: int) -> list[dict]:
    """A save of ``config`` holding ``rows`` rows, as ``servers`` servers would write it.

    Rows ``mix64(0..rows-1)``, embeddings uniform in [-0.01, 0.01], the rest zero. One file
    per server per :data:`CHUNK` rows, each recording its writer rank and the server count,
    so every server imports only its own files. Returns the records for ``PSClient.load``.
    """
    from sparseps.files import shards
    from sparseps.table import SparseTable

    template = SparseTable(config).export_rows()  # the column names, dtypes and widths
    meta = {"table": config.name, "config": config.to_dict(), "num_servers": servers}
    records = []
    for part, start in enumerate(range(0, rows, CHUNK)):
        stop = min(rows, start + CHUNK)
        keys = table_keys(start, stop)
        owner = server_of(keys, servers)
        rng = np.random.default_rng(part)
        columns = {
            name: np.zeros((stop - start, *values.shape[1:]), values.dtype)
            for name, values in template.items()
        }
        columns["key"] = keys
        columns["embedding"] = rng.random((stop - start, config.dim), np.float32) * 0.02 - 0.01
        for rank in range(servers):
            mine = owner == rank
            name = shards.file_name(config.name, "rows", rank, servers)
            name = f"{name.removesuffix('.arrow')}.part-{part:05d}.arrow"
            picked = {k: v if servers == 1 else v[mine] for k, v in columns.items()}
            record = shards.write_shard(
                folder, name, picked, {**meta, "rank": rank, "kind": "rows"}
            )
            records.append(record)
        del columns, picked
    return records


class _Workers:
    """Worker processes (this file with ``--worker``), driven by JSON lines on stdin."""

    def __init__(self, count: int, log_dir: Path) -> None:
        self.logs = [log_dir / f"worker.{rank}.log" for rank in range(count)]
        self.procs = []
        for rank, log in enumerate(self.logs):
            with open(log, "wb") as err:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-P", __file__, "--worker", str(rank)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                    )  # fmt: skip
                )

    def send(self, ranks, message: dict) -> None:
        for rank in ranks:
            stdin = self.procs[rank].stdin
            assert stdin is not None
            stdin.write(json.dumps(message).encode() + b"\n")
            stdin.flush()

    def reply(self, rank: int) -> dict:
        proc = self.procs[rank]
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], REPLY_TIMEOUT)
        line = proc.stdout.readline() if ready else b""
        if not line:
            tail = self.logs[rank].read_text(errors="replace")[-2000:]
            raise SparsePSError(
                f"bench scaling: worker {rank} gave no answer within {REPLY_TIMEOUT:.0f} s "
                f"(exit code {proc.poll()}); its stderr ends:\n{tail}"
            )
        return json.loads(line)

    def call(self, ranks, message: dict) -> list[dict]:
        self.send(ranks, message)
        return [self.reply(rank) for rank in ranks]

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()  # end of input: the worker exits
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _window(cluster, workers: _Workers, count: int, rows: int, seconds: float) -> dict:
    """One timed window: ``count`` workers train for ``seconds`` on keys from ``rows`` rows."""
    ranks = range(count)
    workers.call(ranks, {"op": "warm", "rows": rows, "steps": 3})
    server_pids = [cluster.pid(rank) for rank in range(len(cluster.endpoints))]
    worker_pids = [workers.procs[rank].pid for rank in ranks]
    each_server = [cpu_seconds(pid) for pid in server_pids]
    worker_cpu = sum(cpu_seconds(pid) for pid in worker_pids)
    start = time.perf_counter()
    results = workers.call(ranks, {"op": "train", "rows": rows, "seconds": seconds})
    wall = time.perf_counter() - start
    each_server = [
        cpu_seconds(pid) - cpu for pid, cpu in zip(server_pids, each_server, strict=True)
    ]
    worker_cpu = sum(cpu_seconds(pid) for pid in worker_pids) - worker_cpu
    samples = sum(r["samples"] for r in results)
    return {
        "samples_per_s": samples / wall,
        "server_cpu_us": sum(each_server) / samples * 1e6,
        # the busiest server's (hot keys: the server holding the popular rows)
        "busiest_server_cpu_us": max(each_server) / samples * 1e6,
        "worker_cpu_us": worker_cpu / samples * 1e6,
        "samples": samples,
        "wall_s": wall,
    }


def _measure(cluster, workers: _Workers, count: int, rows: int, seconds: float, rounds: int):
    """The best of ``rounds`` windows (on a shared machine noise only ever slows down)."""
    windows = [_window(cluster, workers, count, rows, seconds) for _ in range(rounds)]
    return max(windows, key=lambda r: r["samples_per_s"])


def _label(rows: int) -> str:
    return f"{rows // 1_000_000}M" if rows % 1_000_000 == 0 else f"{rows // 1000}k"


def _records(series: str, points: list, base: dict, base_name: str, common: dict) -> list:
    records = []
    for (rows, servers, count), got in points:
        params = {"series": series, "rows": rows, "servers": servers, "workers": count,
                  "worker_cpu_us_per_sample": round(got["worker_cpu_us"], 1),
                  "samples": got["samples"], "wall_s": round(got["wall_s"], 2),
                  "baseline": f"{base_name}, same run", **common}  # fmt: skip
        records += [
            BenchRecord(f"samples_per_s[{series}]", got["samples_per_s"], "samples/s",
                        base["samples_per_s"], params),
            BenchRecord(f"server_cpu_us_per_sample[{series}]", got["server_cpu_us"], "us",
                        base["server_cpu_us"], params),
            # what one server core trains: the servers a job needs = its samples/s / this
            BenchRecord(f"samples_per_s_per_server_core[{series}]", 1e6 / got["server_cpu_us"],
                        "samples/s", 1e6 / base["server_cpu_us"], params),
        ]  # fmt: skip
    return records


def _fill(client, folder: Path, rows: int, servers: int) -> None:
    """Load a generated save of ``rows`` rows into the servers (the bulk path)."""
    save = folder / f"save-{rows}-{servers}"
    try:
        done = client.load(TABLE, write_filled_save(save, _config(), rows, servers), timeout=3600)
    finally:
        shutil.rmtree(save, ignore_errors=True)
    if done["rows"] != rows:
        raise SparsePSError(f"bench scaling: the servers loaded {done} of {rows} rows")


def _hot_keys(
    replicas: int, rows: int, seconds: float, rounds: int, common: dict
) -> list[BenchRecord]:
    """The busiest server's CPU per sample with reads spread over a shard's copies against
    reads at the head only, alternating windows on one cluster (module docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="sparseps-bench-scaling-hot-"))
    pool = _Workers(HOT_WORKERS, folder)
    ranks = range(HOT_WORKERS)
    got: dict[bool, list[dict]] = {False: [], True: []}
    try:
        with local_cluster(servers=HOT_SERVERS, replicas=replicas, timeout=60) as cluster:
            client = cluster.client(timeout=120)
            client.create_table(_config())
            _fill(client, folder, rows, HOT_SERVERS)
            connect = {"op": "connect", "endpoints": list(cluster.endpoints),
                       "replicas": replicas, "zipf": ZIPF_A}  # fmt: skip
            pool.call(ranks, connect)
            for _ in range(rounds):
                for spread in (False, True):
                    pool.call(ranks, {"op": "spread", "on": spread})
                    got[spread].append(_window(cluster, pool, HOT_WORKERS, rows, seconds))
    finally:
        pool.close()
        shutil.rmtree(folder, ignore_errors=True)
    off, on = (min(got[s], key=lambda r: r["busiest_server_cpu_us"]) for s in (False, True))
    params = {"series": "hot", "rows": rows, "servers": HOT_SERVERS, "workers": HOT_WORKERS,
              "replicas": replicas, **common, "keys": f"zipf({ZIPF_A}) over all rows",
              "baseline": "the same cluster with every read at the shard's head, windows "
                          "alternating in one run"}  # fmt: skip
    records = []
    for spread, point in (("off", off), ("on", on)):
        extra = {**params, "spread_reads": spread,
                 "server_cpu_us_per_sample": round(point["server_cpu_us"], 2),
                 "samples_per_s": round(point["samples_per_s"]), "samples": point["samples"]}  # fmt: skip
        records.append(
            BenchRecord(f"busiest_server_cpu_us_per_sample[hot spread={spread}]",
                        point["busiest_server_cpu_us"], "us", off["busiest_server_cpu_us"], extra)
        )  # fmt: skip
    return records


def _point(rows: int, count: int, seconds: float, rounds: int) -> dict:
    """One point measured by this process's ``sparseps`` (whatever ``PYTHONPATH`` gave it):
    1 server, ``count`` workers, ``rows`` rows; the best of ``rounds`` windows."""
    folder = Path(tempfile.mkdtemp(prefix="sparseps-bench-scaling-point-"))
    pool = _Workers(count, folder)
    try:
        with local_cluster(servers=1, timeout=60) as cluster:
            client = cluster.client(timeout=120)
            client.create_table(_config())
            pool.call(range(count), {"op": "connect", "endpoints": list(cluster.endpoints)})
            _fill(client, folder, rows, 1)
            got = _measure(cluster, pool, count, rows, seconds, rounds)
    finally:
        pool.close()
        shutil.rmtree(folder, ignore_errors=True)
    import sparseps

    return {**got, "code": str(Path(sparseps.__file__).resolve().parent)}


def _tree_of(ref: str, folder: Path) -> Path:
    """The repository's files at commit ``ref`` (``git archive``), extracted under ``folder``."""
    root = Path(__file__).resolve().parents[1]
    tree = folder / f"tree-{ref}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", ref],
                             capture_output=True, check=False)  # fmt: skip
    if archive.returncode != 0:
        raise ConfigError(f"bench scaling: {AGAINST_ENV}={ref}: git archive failed: "
                          f"{archive.stderr.decode(errors='replace').strip()}")  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def _run_point(code: Path, rows: int, count: int, seconds: float, rounds: int) -> dict:
    """:func:`_point` in a fresh interpreter importing ``sparseps`` from ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    env.pop(AGAINST_ENV, None)
    arg = json.dumps({"rows": rows, "workers": count, "seconds": seconds, "rounds": rounds})
    done = subprocess.run([sys.executable, "-P", __file__, "--point", arg], env=env,
                          capture_output=True, check=False, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise SparsePSError(f"bench scaling: the point run on {code} failed "
                            f"({done.returncode}): {done.stderr.decode(errors='replace')[-2000:]}")  # fmt: skip
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _against(ref: str, pairs: int, rows: int, count: int, seconds: float, rounds: int,
             common: dict) -> list[BenchRecord]:  # fmt: skip
    """Today's code against commit ``ref`` on one point, runs alternating (module docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="sparseps-bench-scaling-against-"))
    try:
        trees = {"before": _tree_of(ref, folder), "after": Path(__file__).resolve().parents[1]}
        got: dict[str, list[dict]] = {"before": [], "after": []}
        for pair in range(pairs):
            for side in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                point = _run_point(trees[side], rows, count, seconds, rounds)
                point["load"] = _load()
                got[side].append(point)
                print(f"bench scaling: pair {pair} {side}: {point['server_cpu_us']:.2f} us of "
                      f"server CPU a sample, {point['samples_per_s']:.0f} samples/s "
                      f"({point['load']})", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    med = {side: {k: float(np.median([p[k] for p in got[side]]))
                  for k in ("server_cpu_us", "samples_per_s")} for side in got}  # fmt: skip
    ratios = [a["server_cpu_us"] / b["server_cpu_us"]
              for a, b in zip(got["after"], got["before"], strict=True)]  # fmt: skip
    params = {"series": "against", "rows": rows, "servers": 1, "workers": count,
              "against": ref, "pairs": pairs, **common,
              "before_us": [round(p["server_cpu_us"], 2) for p in got["before"]],
              "after_us": [round(p["server_cpu_us"], 2) for p in got["after"]],
              "pair_ratios": [round(r, 3) for r in ratios],
              "loads": [p["load"] for side in got for p in got[side]],
              "baseline": f"commit {ref} (git archive on PYTHONPATH), medians of runs "
                          "alternating with today's in this run"}  # fmt: skip
    return [
        BenchRecord("server_cpu_us_per_sample[against]", med["after"]["server_cpu_us"], "us",
                    med["before"]["server_cpu_us"], params),
        BenchRecord("samples_per_s[against]", med["after"]["samples_per_s"], "samples/s",
                    med["before"]["samples_per_s"], params),
    ]  # fmt: skip


def _sample_cpu(pid_file: Path, samples: list, stop) -> None:
    """Append ``(time, CPU seconds)`` of the process named in ``pid_file`` every 0.1 s
    until ``stop`` is set (the peer's server: its pid appears once it is up)."""
    pid = None
    while not stop.is_set():
        if pid is None and pid_file.is_file():
            with contextlib.suppress(ValueError, KeyError):
                pid = int(json.loads(pid_file.read_text())["pid"])
        if pid is not None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                samples.append((time.time(), cpu_seconds(pid)))
        stop.wait(0.1)


def _cpu_at(samples: list, when: float) -> float:
    """The sampled CPU seconds at time ``when`` (linear between the samples around it)."""
    times = np.array([t for t, _ in samples])
    cpus = np.array([c for _, c in samples])
    if not times.size or when < times[0] or when > times[-1]:
        raise SparsePSError(f"bench scaling: the peer's server CPU was not sampled at {when}")
    return float(np.interp(when, times, cpus))


def paddle_server_cpu(rows: int, workers: int) -> dict:
    """The Paddle peer (:data:`PADDLE_RUN`) on ``rows`` generated Criteo-format rows, 1
    server + ``workers`` trainers, deep table only (dim 8, ``--no-wide``), its default
    rule (sparse Adam): the server process's CPU over the trainers' training window
    (first ``train_start`` to last ``train_end``, read from ``/proc/PID/stat`` every 0.1 s
    and interpolated) / the rows they trained."""
    import threading

    from sparseps.data.synthetic import write_dataset

    if not PADDLE_RUN.is_file():
        raise SparsePSError(f"bench scaling: {PEER_ENV}=paddle needs {PADDLE_RUN}")
    folder = Path(tempfile.mkdtemp(prefix="sparseps-bench-scaling-paddle-"))
    try:
        write_dataset(folder / "data", rows=rows, seed=2026, files=2 * workers,
                      test_rows=10_000)  # fmt: skip
        run_dir = folder / "run"
        env = {**os.environ, "TRAIN_DIR": str(folder / "data" / "train"),
               "TEST_FILE": str(folder / "data" / "test" / "part-00000.tsv"),
               "TRAINERS": str(workers), "SERVERS": "1", "RUN_DIR": str(run_dir)}  # fmt: skip
        samples: list = []
        stop = threading.Event()
        sampler = threading.Thread(
            target=_sample_cpu, args=(run_dir / "res" / "server.0.json", samples, stop)
        )
        sampler.start()
        try:
            done = subprocess.run(["bash", str(PADDLE_RUN), "--no-wide", "--emb-dim", str(DIM)],
                                  env=env, capture_output=True, check=False, timeout=1800)  # fmt: skip
        finally:
            stop.set()
            sampler.join()
        trainers = [
            json.loads(p.read_text()) for p in sorted((run_dir / "res").glob("trainer.*.json"))
        ]
        if done.returncode != 0 or len(trainers) != workers:
            raise SparsePSError(f"bench scaling: the Paddle peer failed ({done.returncode}): "
                                f"{done.stderr.decode(errors='replace')[-2000:]}")  # fmt: skip
        start = min(t["train_start"] for t in trainers)
        end = max(t["train_end"] for t in trainers)
        trained = sum(t["rows"] for t in trainers)
        cpu = _cpu_at(samples, end) - _cpu_at(samples, start)
        return {"server_cpu_us": cpu / trained * 1e6, "samples_per_s": trained / (end - start),
                "samples": trained, "wall_s": end - start,
                "summary": done.stdout.decode(errors="replace").strip().splitlines()[-1]}  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _with_peer(records: list[BenchRecord], rows: int, common: dict) -> list[BenchRecord]:
    """Add the Paddle peer's server CPU per sample beside ours (2 workers, the first size)."""
    ours = next((r for r in records if r.metric in ("server_cpu_us_per_sample[workers]",
                                                  "server_cpu_us_per_sample[against]")
                 and r.params.get("workers") == 2), None)  # fmt: skip
    peer = paddle_server_cpu(rows, 2)
    params = {**common, "series": "peer", "workers": 2, "servers": 1, "peer": "paddle 2.6.2 PS",
              "peer_rows": peer["samples"], "peer_samples_per_s": round(peer["samples_per_s"]),
              "peer_model": f"wide&deep without the wide table, dim {DIM}, sparse Adam (the "
                            "peer's default rule), its reader on generated Criteo-format rows",
              "peer_run": peer["summary"],
              "baseline": "the Paddle peer's server, same machine, same run"}  # fmt: skip
    if ours is None:
        raise SparsePSError("bench scaling: no 2-worker point of ours to set beside the peer's")
    return [*records, BenchRecord("server_cpu_us_per_sample[vs paddle]", ours.value, "us",
                                  peer["server_cpu_us"], params)]  # fmt: skip


def _peer(records: list[BenchRecord], quick: bool, common: dict) -> list[BenchRecord]:
    peer = os.environ.get(PEER_ENV)
    if not peer:
        return records
    if peer != "paddle":
        raise ConfigError(f"bench scaling: {PEER_ENV} must be 'paddle', got {peer!r}")
    return _with_peer(records, PEER_QUICK_ROWS if quick else PEER_ROWS, common)


def run(
    quick: bool = False,
    *,
    sizes: tuple[int, ...] | None = None,
    servers: tuple[int, ...] = SERVERS,
    workers: tuple[int, ...] = WORKERS,
    seconds: float | None = None,
    rounds: int | None = None,
    replicas: int | None = None,
) -> list[BenchRecord]:
    """The three series (module docstring); the keyword arguments shrink them for tests.
    ``replicas`` (``--replicas R``): the hot-keys series instead (on ``sizes[0]`` rows
    when ``sizes`` is given, else :data:`HOT_ROWS`)."""
    hot_rows = sizes[0] if sizes else HOT_ROWS
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    seconds = seconds or (QUICK_SECONDS if quick else SECONDS)
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    if replicas is not None:
        common = {"seconds": seconds, "rounds": rounds, "batch": BATCH, "slots": SLOTS,
                  "dim": DIM, "rule": "adagrad", **cpu_note()}  # fmt: skip
        return _hot_keys(replicas, hot_rows, seconds, max(rounds, 2), common)
    against = os.environ.get(AGAINST_ENV)
    if against:
        pairs = int(os.environ.get(PAIRS_ENV, "3" if quick else "5"))
        common = {"seconds": seconds, "rounds": rounds, "batch": BATCH, "slots": SLOTS,
                  "dim": DIM, "rule": "adagrad", "keys": "uniform over all rows",
                  **cpu_note()}  # fmt: skip
        records = _against(against, pairs, sizes[0], AGAINST_WORKERS, seconds, rounds, common)
        return _peer(records, quick, common)
    small, most, s0, w0 = sizes[0], max(workers), servers[0], workers[0]
    common = {"seconds": seconds, "rounds": rounds, "batch": BATCH, "slots": SLOTS, "dim": DIM,
              "dense": DENSE, "rule": "adagrad",
              "model": "wide_deep head " + "-".join(map(str, HIDDEN)) + ", 1 torch thread",
              "keys": "uniform over all rows", **cpu_note()}  # fmt: skip
    got: dict[tuple[int, int, int], dict] = {}
    skipped: dict[int, str] = {}
    folder = Path(tempfile.mkdtemp(prefix="sparseps-bench-scaling-"))
    pool = _Workers(most, folder)  # they import torch while the first save is written
    try:
        for count_servers in servers:
            # on the first server count: the worker series, then the larger tables
            plan = [(small, w) for w in workers] + [(r, w0) for r in sizes[1:]]
            if count_servers != s0:
                plan = [(small, most)]
            with local_cluster(servers=count_servers, timeout=60) as cluster:
                client = cluster.client(timeout=120)
                client.create_table(_config())
                pool.call(range(most), {"op": "connect", "endpoints": list(cluster.endpoints)})
                loaded = 0
                for rows, count in plan:
                    if rows != loaded:
                        reason = skipped.get(rows) or _skip_reason(rows, loaded, folder)
                        if reason is not None:
                            skipped[rows] = reason
                            continue
                        _fill(client, folder, rows, count_servers)
                        loaded = rows
                    got[(rows, count_servers, count)] = _measure(
                        cluster, pool, count, rows, seconds, rounds
                    )
    finally:
        pool.close()
        shutil.rmtree(folder, ignore_errors=True)
    series = {
        "rows": ([(r, s0, w0) for r in sizes], f"rows={_label(small)} servers={s0} workers={w0}"),
        "servers": ([(small, s, most) for s in servers], f"servers={s0} workers={most}"),
        "workers": ([(small, s0, w) for w in workers], f"rows={_label(small)} servers={s0} workers={w0}"),
    }  # fmt: skip
    records: list[BenchRecord] = []
    for name, (configs, base_name) in series.items():
        if configs[0] in got:  # else its size was skipped: the skipped record says why
            points = [(c, got[c]) for c in configs if c in got]
            records += _records(name, points, got[configs[0]], base_name, common)
    records = _peer(records, quick, common)
    for rows, reason in skipped.items():
        print(f"bench scaling: {rows} rows skipped: {reason}", file=sys.stderr)
        records.append(
            BenchRecord(
                "skipped[rows]",
                float(rows),
                "rows",
                None,
                {"rows": rows, "reason": reason, **common},
            )  # fmt: skip
        )
    return records


# -- the worker process -------------------------------------------------------------------


def _worker(rank: int) -> None:
    import torch
    import torch.nn.functional as F

    from sparseps.models.wide_deep import WideDeepHead
    from sparseps.rpc.client import PSClient

    torch.set_num_threads(1)  # workers and servers share the cores (as the demo job)
    torch.manual_seed(rank)
    head = WideDeepHead(SLOTS, DENSE, DIM, HIDDEN)
    opt = torch.optim.Adam(head.parameters(), lr=0.001)
    wide = torch.zeros(BATCH, SLOTS, 1)
    rng = np.random.default_rng(1000 + rank)
    client = None
    zipf = None  # the hot-keys series: Zipf exponent of the rows' popularity

    def draw(rows: int):
        if zipf is None:
            picked = rng.integers(0, rows, BATCH * SLOTS, dtype=np.uint64)
        else:  # row r is the r-th most popular; the rare draws past the table wrap around
            picked = ((rng.zipf(zipf, BATCH * SLOTS) - 1) % rows).astype(np.uint64)
        keys = mix64_array(picked)
        dense = rng.random((BATCH, DENSE), np.float32)
        label = (rng.random(BATCH) < 0.25).astype(np.float32)
        return keys, torch.from_numpy(dense), torch.from_numpy(label)

    def train(rows: int, steps: int | None, seconds: float | None) -> int:
        assert client is not None
        batch = draw(rows)
        pulled = client.pull(TABLE, batch[0])
        pushed = None
        done, start = 0, time.perf_counter()
        while (steps is None or done < steps) and (
            seconds is None or time.perf_counter() - start < seconds
        ):
            keys, dense, label = batch
            rows_now = np.array(pulled.wait(), copy=True).reshape(BATCH, SLOTS, DIM)
            batch = draw(rows)
            pulled = client.pull(TABLE, batch[0])  # in flight while this batch computes
            emb = torch.from_numpy(rows_now).requires_grad_()
            loss = F.binary_cross_entropy_with_logits(head(dense, emb, wide).reshape(-1), label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            grads = emb.grad.numpy().reshape(-1, DIM)  # type: ignore[union-attr]
            if pushed is not None:
                pushed.wait()
            pushed = client.push(TABLE, keys, grads)
            done += 1
        pulled.wait()
        if pushed is not None:
            pushed.wait()
        return done * BATCH

    for line in sys.stdin:
        message = json.loads(line)
        op = message["op"]
        if op == "connect":
            if client is not None:
                client.close()
            client = PSClient(
                message["endpoints"], timeout=120, replicas=message.get("replicas", 0)
            )
            zipf = message.get("zipf")
            answer: dict = {"ok": True}
        elif op == "spread":
            assert client is not None
            client.views.spread_reads = message["on"]
            answer = {"ok": True}
        elif op == "warm":
            answer = {"samples": train(message["rows"], message["steps"], None)}
        elif op == "train":
            answer = {"samples": train(message["rows"], None, message["seconds"])}
        else:
            raise SparsePSError(f"bench scaling worker: unknown op {op!r}")
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    if client is not None:
        client.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--point":
        spec = json.loads(sys.argv[2])
        point = _point(spec["rows"], spec["workers"], spec["seconds"], spec["rounds"])
        sys.stdout.write(json.dumps(point) + "\n")
    else:
        sys.exit("usage: sparseps bench scaling [--quick] (this file runs workers itself)")
