"""Requests that would cost the service more than its limits allow, and malformed ones,
against a real ``sparseps serve`` process: each gets a 4xx whose message starts with the
field, none a 5xx, and a bomb (a few KB of compressed Arrow that decode to hundreds of
MB) is refused before it is decoded: the service's peak RSS does not grow and a
``/healthz`` sent meanwhile answers at once.

The service here is this module's own (``limited``): a base of the session's chain, with
``--max-body-mb 1 --max-rows 1000``, so that its memory is measured without the hot
reloads of the session's service.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from _servetools import land

ARROW = "application/vnd.apache.arrow.stream"
JSON = "application/json"
GROWTH_BYTES = 64 << 20  # the peak RSS a refused bomb may add (today's code: 0.1 to 1 GB)
HEALTHZ_S = 1.0  # the slowest /healthz answer allowed while a bomb is refused (today: 4-6 s)


@pytest.fixture(scope="module")
def limited(chain_job, tmp_path_factory):
    from sparseps.serving import ServeProcess

    model = tmp_path_factory.mktemp("limited") / "model"
    land(chain_job.wait_for("base-00000"), model)
    extra = ["--max-rows", "1000", "--max-body-mb", "1"]
    with ServeProcess(model, poll_s=60, extra_args=extra) as process:
        yield process


@pytest.fixture(scope="module")
def client(limited):
    with httpx.Client(base_url=limited.url, timeout=120) as c:
        yield c


def arrow_body(batches: list[pa.RecordBatch], compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def memory(pid: int, field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> int:
    """Set the process's peak RSS to its RSS now (Linux ``clear_refs`` 5); returns it."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return memory(pid, "VmHWM")


def no_5xx(client: httpx.Client) -> None:
    """The service never answered a 5xx (its own request counter)."""
    lines = client.get("/metrics").text.splitlines()
    served = [line for line in lines if line.startswith("sparseps_serve_requests_total{")]
    assert served and not [line for line in served if 'status="5' in line], served


class HealthProbe(threading.Thread):
    """``GET /healthz`` in a loop until stopped; keeps (seconds, status) of each answer."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.answers: list[tuple[float, int]] = []
        self.running = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as probe:
            for _ in range(1_000_000):  # bounded; stopped long before
                if self.stop.is_set():
                    return
                start = time.perf_counter()
                status = probe.get("/healthz").status_code
                self.answers.append((time.perf_counter() - start, status))
                self.running.set()


def ids_bomb() -> bytes:
    """One row whose slot C1 holds 16M ids (128 MB decoded), zstd-compressed."""
    ids = pa.array(np.zeros(16 << 20, np.uint64))
    column = pa.ListArray.from_arrays(pa.array([0, len(ids)], pa.int32()), ids)
    return arrow_body([pa.record_batch({"C1": column})], "zstd")


def null_ids_bomb() -> bytes:
    """One row whose C1 is a list of 16M nulls: no buffer holds them, so the body is
    small even uncompressed, and expanding them costs hundreds of MB."""
    column = pa.ListArray.from_arrays(pa.array([0, 16 << 20], pa.int32()), pa.nulls(16 << 20))
    return arrow_body([pa.record_batch({"C1": column})])


def rows_bomb() -> bytes:
    """64M rows of I1 (512 MB decoded) in 8 batches, zstd-compressed."""
    batch = pa.record_batch({"I1": pa.array(np.zeros(8 << 20, np.int64))})
    return arrow_body([batch] * 8, "zstd")


def bytes_bomb() -> bytes:
    """One row, one 100 MB string in C1, zstd-compressed."""
    text = pa.array([b"a" * (100 << 20)], pa.string())
    return arrow_body([pa.record_batch({"C1": text})], "zstd")


@pytest.mark.parametrize(
    ("make", "field"),
    [(ids_bomb, "ids: "), (null_ids_bomb, "ids: "), (rows_bomb, "rows: "), (bytes_bomb, "body: ")],
)
def test_a_bomb_is_refused_before_it_is_decoded(limited, client, make, field):
    body = make()
    assert len(body) < 64 << 10  # a few KB on the wire
    before = reset_peak(limited.pid)
    probe = HealthProbe(limited.url)
    probe.start()
    try:
        assert probe.running.wait(60), "no /healthz answer"
        got = client.post("/predict", content=body, headers={"content-type": ARROW})
        after = client.get("/healthz")  # the probe has answers from during the bomb
    finally:
        probe.stop.set()
        probe.join(120)
    grown = memory(limited.pid, "VmHWM") - before
    slowest = max(seconds for seconds, _ in probe.answers)
    measured = (
        f"{got.status_code} {got.text[:200]}; peak RSS +{grown >> 20} MB; /healthz {slowest:.2f} s"
    )
    print(f"{make.__name__}: {len(body)} bytes: {measured}")  # shown by pytest -rP
    assert got.status_code == 413 and got.json()["error"].startswith(field), measured
    assert grown < GROWTH_BYTES, measured
    assert slowest < HEALTHZ_S, measured
    assert {status for _, status in probe.answers} == {200} and after.status_code == 200
    no_5xx(client)


def test_rows_over_the_limit_across_batches(client):
    """Three batches of 400 rows: refused at the third, whatever each batch holds."""
    batch = pa.record_batch({"I1": pa.array(np.ones(400))})
    got = client.post("/predict", content=arrow_body([batch] * 3), headers={"content-type": ARROW})
    assert got.status_code == 413, got.text
    assert got.json()["error"].startswith("rows: "), got.json()
    under = client.post(
        "/predict", content=arrow_body([batch] * 2), headers={"content-type": ARROW}
    )
    assert under.status_code == 200 and under.json()["rows"] == 800, under.text
    no_5xx(client)


def float32_cases() -> list:
    big = pa.record_batch({"I1": pa.array([1.0, 1e39])})
    arrow = arrow_body([big])
    return [
        (json.dumps({"rows": [{"I1": 1e39}]}).encode(), JSON, JSON, "I1: row 0"),
        (json.dumps({"rows": [{"I1": 1e39}]}).encode(), JSON, ARROW, "I1: row 0"),
        (json.dumps({"rows": [{"I1": 2}, {"I1": -1e39}]}).encode(), JSON, ARROW, "I1: row 1"),
        (json.dumps({"columns": {"I2": [1, 1e39]}}).encode(), JSON, JSON, "I2: row 1"),
        (json.dumps({"rows": [{"I3": "1e39"}]}).encode(), JSON, ARROW, "I3: row 0"),
        (arrow, ARROW, ARROW, "I1: row 1"),
        (arrow, ARROW, JSON, "I1: row 1"),
    ]


@pytest.mark.parametrize(("body", "content_type", "accept", "field"), float32_cases())
def test_values_beyond_float32_are_refused(client, body, content_type, accept, field):
    """Finite in JSON and float64, infinite in float32 (the model's input type)."""
    got = client.post(
        "/predict", content=body, headers={"content-type": content_type, "accept": accept}
    )
    assert got.status_code == 400, (got.status_code, got.content[:200])
    error = got.json()["error"]
    assert error.startswith(field) and "float32" in error, error
    no_5xx(client)


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (nested(100_000), "body: "),
        ('{"rows": ' + nested(100_000, "{}") + "}", "body: "),
        ('{"rows": [{"C1": ' + nested(100_000) + "}]}", "body: "),
        ('{"rows": [{"C1": ' + nested(500) + "}]}", "C1: "),
        ('{"columns": {"C2": [' + nested(500) + "]}}", "C2: "),
    ],
)
def test_deeply_nested_json_is_refused(client, body, field):
    got = client.post("/predict", content=body.encode(), headers={"content-type": JSON})
    assert got.status_code == 400, (got.status_code, got.content[:200])
    error = got.json()["error"]
    assert error.startswith(field) and len(error) < 500, error[:1000]
    no_5xx(client)


def test_a_column_sent_twice_is_refused(client):
    for names in (["I1", "I1"], ["C1", "I2", "C1"], ["label", "label"]):
        columns = [pa.array([1.0]) if n != "C1" else pa.array(["a"]) for n in names]
        table = pa.Table.from_arrays(columns, names=names)
        body = arrow_body(table.to_batches())
        got = client.post("/predict", content=body, headers={"content-type": ARROW})
        assert got.status_code == 400, (names, got.status_code, got.content[:200])
        error = got.json()["error"]
        assert error.startswith(f"{names[0]}: ") and "2 times" in error, error
    no_5xx(client)


def lying_offsets(offsets: list[int]) -> bytes:
    """A stream of one list column (C2, two rows) whose offsets are rewritten to
    ``offsets`` in the body after it was written: what a damaged or hostile client sends."""
    lists = pa.ListArray.from_arrays(
        pa.array([0, 1, 3], pa.int32()), pa.array([7] * 3, pa.uint64())
    )
    body = arrow_body([pa.record_batch({"C2": lists})])
    written = np.array([0, 1, 3], "<i4").tobytes()
    assert body.count(written) == 1
    return body.replace(written, np.array(offsets, "<i4").tobytes())


@pytest.mark.parametrize(
    "offsets", [[0, 1, 1 << 30], [0, 3, 1], [0, -1, 3], [0, 1, -3], [5, 1, 3], [-8, 1, 3]]
)
def test_list_offsets_that_lie_are_refused(limited, client, offsets):
    """Each decoded batch is validated in full. Before, [0, 3, 1] and [0, -1, 3] answered
    200 from ids read outside the column, the others got 500s, and [0, 1, 2**30] crashed
    the interpreter (SIGSEGV) when decoded in process. (Last in the module, so a crash
    takes no other test's service down.)"""
    got = client.post("/predict", content=lying_offsets(offsets), headers={"content-type": ARROW})
    assert got.status_code == 400, (got.status_code, got.content[:200])
    error = got.json()["error"]
    assert error.startswith("body: not an Arrow IPC stream") and "ffset" in error, error
    assert client.get("/healthz").status_code == 200 and limited.process.poll() is None
    no_5xx(client)
