"""``sparseps serve --workers 2``: one port, two processes that share the model's mapped
row files; connections opened at once are spread evenly over the workers; a worker that
dies is started again; stopping the supervisor stops them all.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
from _servetools import land, samples

from sparseps.serving import ServeProcess, criteo_request_rows
from sparseps.testing import wait_until

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


def at_once(url: str, body: bytes, count: int) -> list[socket.socket]:
    """``count`` connections opened together, one request each answered; still open."""
    parts = urlsplit(url)
    request = (
        f"POST /predict HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    go = threading.Barrier(count)
    conns: list[socket.socket] = []
    answers: list[bytes] = []

    def one() -> None:
        go.wait()
        conn = socket.create_connection((parts.hostname, parts.port), timeout=60)
        conn.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            got += conn.recv(1 << 16)
        conns.append(conn)
        answers.append(got)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(answers) == count and all(a.startswith(b"HTTP/1.1 200") for a in answers)
    return conns


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

        # 6 connections opened at once: 3 to each worker (with `client`'s: 4 and 3), where
        # workers accepting from one socket got them 4-2, 5-1 or 6-0 as often as not
        opened = at_once(service.url, orjson.dumps({"rows": rows}), 6)
        accepted = [w["accepted"] for w in client.get("/model").json()["workers"]]
        assert sorted(accepted) == [3, 4], accepted
        for conn in opened:
            conn.close()
        wait_until(
            lambda: sum(w["closed"] for w in client.get("/model").json()["workers"]) >= 6,
            WAIT_S,
            "the closed connections counted",
            0.1,
        )

        # /metrics from either worker: every worker's samples, labelled; 7 requests of 8 rows
        def rows_by_worker() -> dict[str, float] | None:
            text = client.get("/metrics").text
            rows_total = {
                s.labels["worker"]: s.value for s in samples(text, "sparseps_serve_rows_total")
            }
            return rows_total if sum(rows_total.values()) == 7 * len(rows) else None

        counted = wait_until(rows_by_worker, WAIT_S, "every worker's rows in /metrics", 0.2)
        assert sorted(counted) == ["0", "1"] and all(counted.values()), counted

        os.kill(pids[0], signal.SIGKILL)

        def restarted_pids() -> list[int] | None:
            with httpx.Client(base_url=service.url, timeout=60) as fresh:  # a new connection
                workers = fresh.get("/model").json()["workers"]
            now = [w["pid"] for w in workers]
            return now if now[0] not in (0, pids[0]) and alive(now[0]) else None

        now = wait_until(restarted_pids, WAIT_S, "worker 0 started again", 0.2)
        assert now[1] == pids[1]
        with httpx.Client(base_url=service.url, timeout=60) as fresh:
            again = fresh.post("/predict", json={"rows": rows})
        assert again.status_code == 200 and again.json()["predictions"] == first
        # the new worker's slot was cleared, and it took the new connections (fewest open)
        restarted = client.get("/model").json()["workers"][0]
        assert restarted["accepted"] >= 1 and restarted["closed"] <= restarted["accepted"]
        assert "worker 0" in service.log() and "starting it again" in service.log()
    # the supervisor stopped: so did every worker
    wait_until(lambda: not any(alive(pid) for pid in now), 30, f"workers {now} stopped", 0.1)
