"""An online job whose workers change between passes, with the launcher's part of the
contract played by the test (docs/elastic.md, "Workers joining and leaving").

:func:`grow_and_shrink` starts a server and workers 0, 1 of an async online job with the
launcher's environment, writes ``elastic/workers`` on the workers' store and starts worker
2 with ``SPARSEPS_WORKER_NUM=3``, then writes the shrink back to 2. The passes'
done-markers are written by the test, so each change lands at a known boundary: pass 0
and 1 run on 2 workers, pass 2 on 3, pass 3 on 2 again (``start=1``: a job launched with
one worker grows to 2 the same way). It checks what holds for any
split (each pass in the ledger once with exactly its rows, every process exits 0) and
returns the effective ledger.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from _onlinetools import ROOT, clean_env, write_config

from sparseps.online import DataLayout, Ledger, load_config, write_stream
from sparseps.rpc.transport import free_port

ROWS_PER_FILE, FILES_PER_SPLIT = 150, 3
MEMBERS = "sparseps/online/members"


_MAIN = (
    "import faulthandler, runpy, signal, sys; faulthandler.register(signal.SIGUSR1); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _env(role: str, rank: int, workers: int, servers: str, master: str, log_dir: Path) -> dict:
    env = clean_env()
    env.update(SPARSEPS_ROLE=role, SPARSEPS_RANK=str(rank), SPARSEPS_SERVERS=servers,
               SPARSEPS_WORKER_NUM=str(workers), SPARSEPS_MASTER=master,
               SPARSEPS_LOG_DIR=str(log_dir), SPARSEPS_JOB_ID="workers-change",
               SPARSEPS_RENDEZVOUS_TIMEOUT_S="60")  # fmt: skip
    return env


class Job:
    """The processes of one job, started as the launcher starts them."""

    def __init__(self, config: Path, log_dir: Path) -> None:
        self.config, self.log_dir = config, log_dir
        self.servers = f"127.0.0.1:{free_port()}"
        self.master = f"127.0.0.1:{free_port()}"
        self.procs: dict[str, subprocess.Popen] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, role: str, rank: int, workers: int) -> None:
        name = f"{role}.{rank}"
        out = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the job
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-c", _MAIN, str(ROOT / "sparseps/online/job.py"), str(self.config)],
            env=_env(role, rank, workers, self.servers, self.master, self.log_dir),
            stdout=out, stderr=subprocess.STDOUT, cwd=self.config.parent,
        )  # fmt: skip

    def wait(self, name: str, timeout: float) -> int:
        return self.procs[name].wait(timeout)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text()[-4000:]

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _store(master: str):
    from sparseps.store.client import StoreClient

    deadline = time.monotonic() + 60
    while True:
        try:
            return StoreClient(master, timeout_s=10, setting="test", what="the workers' store")
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _wait_key(store, key: str, job: Job, timeout: float = 90) -> bytes:
    deadline = time.monotonic() + timeout
    while not store.check([key]):
        dead = {n: p.returncode for n, p in job.procs.items() if p.poll() not in (None, 0)}
        assert not dead, f"{dead}: {[job.log(n) for n in dead]}"
        assert time.monotonic() < deadline, f"{key} did not appear: {job.log('worker.0')}"
        time.sleep(0.05)
    return store.get(key)


def _ready(layout: DataLayout, seq: int) -> None:
    for folder in layout.splits(layout.passes()[seq]):
        (folder / "_SUCCESS").touch()


def grow_and_shrink(tmp_path: Path, split: str, *, shrink: bool = True,
                    start: int = 2) -> list[dict]:  # fmt: skip
    """Run the job (2, 2, 3, then 2 workers again, or 3 with ``shrink=False``: the job
    ends grown and every process still exits 0; ``start=1``: 1, 1, 2 and 1 or 2); the
    effective ledger."""
    stream = tmp_path / "stream"
    write_stream(stream, start_day="20240101", days=1, splits_per_day=4,
                 rows_per_split=ROWS_PER_FILE * FILES_PER_SPLIT, files_per_split=FILES_PER_SPLIT,
                 skip=tuple(("20240101", s) for s in range(4)), seed=5)  # fmt: skip
    path = write_config(tmp_path / "job.yaml", data_root=stream, model_dir=tmp_path / "model",
                        days=1, passes_per_day=4, job={"mode": "async", "worker_num": start},
                        data={"split": split},
                        save={"delta_every": 1, "checkpoint_every": 2})  # fmt: skip
    layout = DataLayout(load_config(path))
    job = Job(path, tmp_path / "log")
    try:
        job.start("server", 0, start)
        for rank in range(start):
            job.start("worker", rank, start)
        _ready(layout, 0)
        store = _store(job.master)
        # boundary 1 (after pass 0) decided with the launch's workers: now grow by one
        assert json.loads(_wait_key(store, f"{MEMBERS}/decision/1", job))["world"] == start
        assert store.check(["elastic/accepts_workers"])  # worker 0 accepts worker scaling
        store.set("elastic/workers", json.dumps({"version": 1, "world": start + 1}))
        job.start("worker", start, start + 1)
        _ready(layout, 1)
        # boundary 2 (after pass 1) admits the new worker; then shrink back
        assert json.loads(_wait_key(store, f"{MEMBERS}/decision/2", job))["world"] == start + 1
        if shrink:
            store.set("elastic/workers", json.dumps({"version": 2, "world": start}))
        _ready(layout, 2)
        _ready(layout, 3)
        assert job.wait(f"worker.{start}", 90) == 0, job.log(f"worker.{start}")
        for rank in range(start):
            assert job.wait(f"worker.{rank}", 90) == 0, job.log(f"worker.{rank}")
        store.close()
    finally:
        job.kill()

    passes = Ledger.of(tmp_path / "model").passes()
    records = [r for r in Ledger.of(tmp_path / "model").records() if r["kind"] == "pass"]
    assert [r["seq"] for r in records] == [0, 1, 2, 3]  # each pass trained and recorded once
    assert [r["seq"] for r in passes] == [0, 1, 2, 3]
    grown = start + 1
    assert [r["workers"] for r in passes] == [start, start, grown, start if shrink else grown]
    per_pass = ROWS_PER_FILE * FILES_PER_SPLIT
    for record in passes:
        assert record["samples"] == per_pass, record  # rows of each pass counted exactly
        assert record["eval"]["count"] == per_pass
        assert sum(record["worker_rows"]) == per_pass
    return passes
