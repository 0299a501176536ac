"""``sparseps bench rpc`` in miniature: the records it promises, each with its own baseline.

A quick run (100k rows, real server processes on loopback, ~6 s): checks the records'
names, units and baselines (the cold pulls share the warm pulls' in-process baseline; the
server's CPU per small request and the paired ratio have none), not the figures themselves.
"""

import math
import time

import pytest

from sparseps.benchmarking import load_benchmark

pytestmark = pytest.mark.timeout(180)

UNITS = {
    "rpc_pull_p50_ms": "ms", "rpc_pull_p99_ms": "ms", "rpc_small_pull_per_s": "pulls/s",
    "rpc_socket_pull_p50_ms": "ms",
}  # fmt: skip


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("rpc")


def test_bench_rpc_records(bench, monkeypatch):
    monkeypatch.setattr(bench, "WARM_S", 0.05)
    records = {}
    for record in bench.run(quick=True):
        records[(record.metric, record.params["servers"])] = record
    pulls_and_pushes = {
        "rpc_pull_rows_per_s", "rpc_pull_cold_rows_per_s", "rpc_push_rows_per_s",
        "rpc_pull_p50_ms", "rpc_pull_p99_ms", "rpc_pull_steady_rows_per_s",
        "rpc_pull_paired_ratio",
    }  # fmt: skip
    # 1 server only: the small pulls, and the pulls of a client without reply slots
    small = {
        "rpc_small_pull_per_s", "rpc_small_pull_server_cpu_us", "rpc_socket_pull_paired_ratio",
        "rpc_socket_pull_p50_ms",
    }  # fmt: skip
    assert set(records) == {(m, 1) for m in pulls_and_pushes | small} | {
        (m, 2) for m in pulls_and_pushes
    }
    for (metric, _servers), record in records.items():
        assert record.value > 0, record
        if metric == "rpc_small_pull_server_cpu_us":
            # the server process's own CPU, read from /proc: no in-process counterpart
            assert record.baseline is None and record.unit == "us"
            continue
        if metric in ("rpc_pull_paired_ratio", "rpc_socket_pull_paired_ratio"):
            # a ratio of each round's own two blocks: its own baseline; rows/s that differ
            # by this much would mean the two sides did not pull the same batches
            assert record.baseline is None and record.unit == "ratio"
            assert 0.05 < record.value < 20, record
            assert record.params.get("reply_slots", 8) == (0 if "socket" in metric else 8)
            continue
        assert record.baseline is not None and record.baseline > 0, record
        assert math.isclose(record.ratio, record.value / record.baseline)
        assert record.unit == UNITS.get(metric, "rows/s"), record
    for servers in (1, 2):
        warm, cold = (
            records[(m, servers)] for m in ("rpc_pull_rows_per_s", "rpc_pull_cold_rows_per_s")
        )
        # one in-process figure is the baseline of both: only the rpc side's start differs
        assert cold.baseline == warm.baseline
        assert "before the warm-up" in cold.params["order"]


def test_warm_runs_its_batches_for_the_time_given(bench):
    calls = []
    start = time.perf_counter()
    bench._warm(calls.append, ["a", "b"], seconds=0.05)
    assert time.perf_counter() - start >= 0.05
    # whole passes over the batches, in order, until the time is up
    assert len(calls) >= 2 and len(calls) % 2 == 0 and calls[:2] == ["a", "b"]


def test_the_paired_ratio_pairs_each_round_with_its_own_baseline(bench):
    remote = [{"pull": 9.0}, {"pull": 4.0}, {"pull": 8.0}]
    base = [{"pull": 10.0}, {"pull": 10.0}, {"pull": 20.0}]
    # rounds: 0.9, 0.4, 0.4 -> 0.4; the best of each side would say 9 / 20 = 0.45
    assert bench._paired_ratio(remote, base) == pytest.approx(0.4)
