"""``sparseps bench scaling`` in miniature: records of the promised shape, real CPU figures.

Tiny tables (20k rows), 1-2 servers and workers, sub-second windows: this checks the
records' names, baselines and notes, that server CPU was really read (a zero would fail),
and that a size over the cap is reported as skipped, not the figures themselves.
"""

import json
import math
import os
import time

import numpy as np
import pytest

from sparseps.benchmarking import load_benchmark
from sparseps.files import shards

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("scaling")


def test_bench_scaling_records(bench, monkeypatch):
    monkeypatch.setenv(bench.MAX_ROWS_ENV, "30000")  # 40k is over the cap: skipped, said so
    records = bench.run(
        quick=True, sizes=(20_000, 40_000), servers=(1, 2), workers=(1, 2), seconds=0.6
    )
    as_json = [json.loads(json.dumps(r.to_json())) for r in records]
    points = {}
    for record in as_json:
        assert set(record) == {"metric", "value", "unit", "baseline", "ratio", "params"}
        params = record["params"]
        assert params["cpus"] == os.cpu_count()
        assert params["cpus_usable"] == len(os.sched_getaffinity(0))
        assert f"{os.cpu_count()} CPUs" in params["note"]
        assert record["value"] > 0
        if record["metric"] == "skipped[rows]":
            continue
        assert record["baseline"] is not None and record["baseline"] > 0
        assert math.isclose(record["ratio"], record["value"] / record["baseline"], rel_tol=1e-9)
        key = (params["series"], params["rows"], params["servers"], params["workers"])
        points.setdefault(key, {})[record["metric"].split("[")[0]] = record
    assert sorted(points) == [
        ("rows", 20_000, 1, 1),
        ("servers", 20_000, 1, 2), ("servers", 20_000, 2, 2),
        ("workers", 20_000, 1, 1), ("workers", 20_000, 1, 2),
    ]  # fmt: skip
    for (_series, _rows, _servers, workers), got in points.items():
        assert set(got) == {
            "samples_per_s", "server_cpu_us_per_sample", "samples_per_s_per_server_core"
        }  # fmt: skip
        throughput, cpu = got["samples_per_s"], got["server_cpu_us_per_sample"]
        per_core = got["samples_per_s_per_server_core"]
        assert per_core["value"] == pytest.approx(1e6 / cpu["value"])
        assert throughput["unit"] == "samples/s" and cpu["unit"] == "us"
        # samples/s is what was trained over the window; server CPU a plausible share of it
        params = throughput["params"]
        assert params["samples"] >= 512 * workers
        assert throughput["value"] == pytest.approx(params["samples"] / params["wall_s"], rel=0.02)
        assert 0.01 < cpu["value"] < 1e5
        assert params["worker_cpu_us_per_sample"] > 0
    # each series' baseline is its first point, measured in the same run
    for series, first in (("rows", (20_000, 1, 1)), ("servers", (20_000, 1, 2)),
                          ("workers", (20_000, 1, 1))):  # fmt: skip
        for metric in points[(series, *first)].values():
            assert metric["ratio"] == pytest.approx(1.0)
    assert (
        points[("servers", 20_000, 1, 2)]["samples_per_s"]["value"]
        == points[("workers", 20_000, 1, 2)]["samples_per_s"]["value"]
    )  # one measurement, two series
    skipped = [r for r in as_json if r["metric"] == "skipped[rows]"]
    assert [(r["value"], r["params"]["rows"]) for r in skipped] == [(40_000, 40_000)]
    assert bench.MAX_ROWS_ENV in skipped[0]["params"]["reason"]


def test_bench_scaling_hot_keys_records(bench):
    """--replicas 1: the busiest server's CPU per sample with spread reads against head
    reads, on one replicated cluster (issue 59)."""
    records = bench.run(quick=True, sizes=(20_000,), seconds=0.6, rounds=1, replicas=1)
    got = {r.metric: r for r in records}
    assert set(got) == {
        "busiest_server_cpu_us_per_sample[hot spread=off]",
        "busiest_server_cpu_us_per_sample[hot spread=on]",
    }
    off = got["busiest_server_cpu_us_per_sample[hot spread=off]"]
    on = got["busiest_server_cpu_us_per_sample[hot spread=on]"]
    assert off.ratio == pytest.approx(1.0) and on.baseline == off.value
    for record in (off, on):
        assert 0.01 < record.value < 1e5 and record.unit == "us"
        assert record.params["replicas"] == 1 and record.params["servers"] == bench.HOT_SERVERS
        assert record.params["samples"] >= 512


def test_skip_reason_names_memory(bench, monkeypatch, tmp_path):
    monkeypatch.delenv(bench.MAX_ROWS_ENV, raising=False)
    monkeypatch.setattr(bench, "_available_bytes", lambda: 4 << 30)
    assert bench._skip_reason(1_000_000, 0, tmp_path) is None
    reason = bench._skip_reason(100_000_000, 0, tmp_path)
    assert reason is not None and reason.startswith("memory: needs ~") and "4.3 GB" in reason


def test_cpu_seconds_reads_this_process(bench):
    before = bench.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:  # 0.1 s of this process's CPU
        pass
    assert bench.cpu_seconds(os.getpid()) - before >= 0.05


def test_filled_save_puts_each_key_in_its_owners_file(bench, tmp_path):
    from sparseps.core.routing import server_of

    records = bench.write_filled_save(tmp_path, bench._config(), 5000, 2)
    assert sum(r["rows"] for r in records) == 5000
    keys = []
    for rank, record in enumerate(records):
        meta, columns = shards.read_shard(record["path"], xxh3_128=record["xxh3_128"])
        assert (meta["rank"], meta["num_servers"], meta["kind"]) == (rank, 2, "rows")
        assert (server_of(columns["key"], 2) == rank).all()
        assert np.abs(columns["embedding"]).max() <= 0.01
        keys.append(columns["key"])
    assert np.array_equal(np.sort(np.concatenate(keys)), np.sort(bench.table_keys(0, 5000)))


@pytest.mark.timeout(600)
def test_bench_scaling_against_a_commit(bench, monkeypatch):
    """SPARSEPS_SCALING_AGAINST: today's code and a commit's, in alternating fresh
    processes, each importing its own sparseps (the point says which it ran)."""
    monkeypatch.setenv(bench.AGAINST_ENV, "HEAD")
    monkeypatch.setenv(bench.PAIRS_ENV, "1")
    records = bench.run(quick=True, sizes=(20_000,), seconds=0.6, rounds=1)
    by_name = {r.metric: r for r in records}
    assert set(by_name) == {"server_cpu_us_per_sample[against]", "samples_per_s[against]"}
    cpu = by_name["server_cpu_us_per_sample[against]"]
    assert cpu.value > 0 and cpu.baseline > 0
    params = cpu.params
    assert params["against"] == "HEAD" and params["workers"] == 2 and params["pairs"] == 1
    assert len(params["before_us"]) == len(params["after_us"]) == len(params["loads"]) // 2 == 1
    assert "alternating" in params["baseline"]


def test_bench_scaling_against_an_unknown_commit_says_so(bench, monkeypatch):
    monkeypatch.setenv(bench.AGAINST_ENV, "no-such-commit-xyz")
    with pytest.raises(Exception, match="git archive failed"):
        bench.run(quick=True, sizes=(20_000,), seconds=0.6, rounds=1)


def test_peer_cpu_is_read_over_the_training_window(bench, monkeypatch):
    samples = [(10.0, 1.0), (11.0, 1.5), (13.0, 3.5)]
    assert bench._cpu_at(samples, 12.0) == pytest.approx(2.5)  # noqa: SLF001
    with pytest.raises(Exception, match="not sampled"):
        bench._cpu_at(samples, 14.0)  # noqa: SLF001
    assert bench._peer([], False, {}) == []  # noqa: SLF001 - no peer asked for
    monkeypatch.setenv(bench.PEER_ENV, "tensorflow")
    with pytest.raises(Exception, match="must be 'paddle'"):
        bench._peer([], False, {})  # noqa: SLF001
