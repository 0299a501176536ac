"""``sparseps serve --workers 2``: one port, two processes that share the model's mapped
row files; a worker that dies is started again; stopping the supervisor stops them all.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
from _servetools import land

from sparseps.serving import ServeProcess, criteo_request_rows

WAIT_S = 120.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.is_file() and "State:\tZ" not in status.read_text()


def mapped_by(pid: int) -> set[str]:
    return {
        line.split(maxsplit=5)[5].strip()
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
        if len(line.split(maxsplit=5)) > 5 and line.rstrip().endswith(".arrow")
    }


def test_two_workers_share_the_rows_and_a_dead_one_comes_back(chain, tmp_path):
    model = tmp_path / "model"
    land(chain.folder("base-00000"), model)
    rows = criteo_request_rows(chain.test_file)[:8]
    with (
        ServeProcess(model, poll_s=60, workers=2) as service,
        httpx.Client(base_url=service.url, timeout=60) as client,
    ):
        described = client.get("/model").json()
        pids = [w["pid"] for w in described["workers"]]
        assert len(pids) == 2 and service.pid not in pids and all(map(alive, pids))
        assert described["sequence_everywhere"] == 0
        # both map the same row files (one copy in the page cache), none copied them
        shared = mapped_by(pids[0])
        assert shared and shared == mapped_by(pids[1])
        assert described["memory"]["mapped_bytes"] > 0
        first = client.post("/predict", json={"rows": rows}).json()["predictions"]

        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while True:
            with httpx.Client(base_url=service.url, timeout=60) as fresh:  # a new connection
                workers = fresh.get("/model").json()["workers"]
            now = [w["pid"] for w in workers]
            if now[0] not in (0, pids[0]) and alive(now[0]):
                break
            assert time.monotonic() < deadline, f"worker 0 was not started again: {workers}"
            time.sleep(0.2)
        assert now[1] == pids[1]
        with httpx.Client(base_url=service.url, timeout=60) as fresh:
            again = fresh.post("/predict", json={"rows": rows})
        assert again.status_code == 200 and again.json()["predictions"] == first
        assert "worker 0" in service.log() and "starting it again" in service.log()
    # the supervisor stopped: so did every worker
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in now):
        assert time.monotonic() < deadline, f"workers left running: {now}"
        time.sleep(0.1)
