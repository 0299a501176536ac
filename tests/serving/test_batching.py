"""Dynamic batching over real HTTP: concurrent clients' requests are answered from shared
model calls, and each answer equals ``sparseps predict`` on the same rows.

A service of its own (one worker, so every request meets the same batcher) serves a fixed
chain of the session's job; 16 client threads, each with its own connection, start
together and send requests of 1, 3 and 7 rows from different places of the test file.
``/model``'s ``batching`` counters show that calls gathered several requests.

The tolerance is the one the service already had against ``sparseps predict`` (which
prints 7 decimals): 5e-7. A batched call is not bit-equal to the request alone in general:
the head's matrix products block their work by the number of rows in the call, and the
sums come out one float32 ulp apart now and then (1.2e-7 near 1.0, measured).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np
from _servetools import land

from sparseps import cli
from sparseps.serving import ServeProcess, criteo_request_rows

CLIENTS = 16
SIZES = (1, 3, 7)
ROUNDS = 4
TOLERANCE = 5e-7


def offline(model: Path, data: Path, capsys) -> np.ndarray:
    """``sparseps predict DIR --data FILE``, the real command, its stdout parsed."""
    capsys.readouterr()
    assert cli.main(["predict", str(model), "--data", str(data)]) == 0
    return np.array([float(line) for line in capsys.readouterr().out.split()], np.float32)


def test_concurrent_requests_share_calls_and_get_their_own_answers(chain, tmp_path, capsys):
    model = tmp_path / "model"
    for name in chain.saves[:4]:  # base-00000 + three deltas
        land(chain.folder(name), model)
    expected = offline(model, chain.test_file, capsys)
    rows = criteo_request_rows(chain.test_file)
    assert expected.size == len(rows) == 200 and np.std(expected) > 0.01

    # a wide window, so that calls gather on a loaded test box too
    extra = ["--batch-max-wait-ms", "20", "--batch-max-rows", "64"]
    with ServeProcess(model, poll_s=60, extra_args=extra) as service:
        start = threading.Barrier(CLIENTS)
        answers: list[tuple[int, int, int, object]] = []
        lock = threading.Lock()

        def client(index: int) -> None:
            with httpx.Client(base_url=service.url, timeout=60) as c:
                c.get("/healthz")  # connected before the barrier
                start.wait(60)
                for round_ in range(ROUNDS):
                    size = SIZES[(index + round_) % len(SIZES)]
                    offset = (index * 11 + round_ * 37) % (len(rows) - size)
                    got = c.post("/predict", json={"rows": rows[offset : offset + size]})
                    body = got.json()
                    with lock:
                        answers.append((got.status_code, offset, size, body))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        with httpx.Client(base_url=service.url, timeout=60) as c:
            batching = c.get("/model").json()["batching"]

    assert len(answers) == CLIENTS * ROUNDS
    for status, offset, size, body in answers:
        assert status == 200, body
        assert isinstance(body, dict) and body["rows"] == size
        np.testing.assert_allclose(
            np.float32(body["predictions"]),
            expected[offset : offset + size],
            rtol=0,
            atol=TOLERANCE,
            err_msg=f"rows {offset}..{offset + size - 1}",
        )
    # every request went through the batcher, and calls gathered several of them
    assert batching["requests"] >= CLIENTS * ROUNDS, batching
    assert batching["calls"] < batching["requests"], batching
    assert batching["largest"] > max(SIZES), batching
    assert batching["max_rows"] == 64 and batching["max_wait_ms"] == 20.0
