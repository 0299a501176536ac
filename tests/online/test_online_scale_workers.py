"""Must-show of issue 23 (workers), launched: ``sparseps online`` grows from 2 to 3 workers
with ``sparseps scale LOG_DIR --workers 3`` while it runs, and back to 2, with a
consistent ledger.

The passes' done-markers are written by the test one pass at a time, so each scale lands
between known passes: the grow is asked after pass 0's ledger line (the new worker joins
at the boundary before pass 1 or 2), the shrink after pass 2's (worker 2 leaves at the
boundary before pass 3 or 4). Each pass is in the ledger once with exactly its rows, the
passes on 3 workers split their files in thirds (worker 2 read its share), and the job
and every process end with 0.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _onlinetools import clean_env, online_argv, write_config

from sparseps.online import DataLayout, Ledger, load_config, write_stream
from sparseps.testing import wait_until

pytestmark = pytest.mark.timeout(240)

ROWS_PER_FILE, FILES_PER_SPLIT, PASSES = 150, 3, 5


def _ready(layout: DataLayout, seq: int) -> None:
    for folder in layout.splits(layout.passes()[seq]):
        (folder / "_SUCCESS").touch()


def _wait_pass(book: Ledger, seq: int, job: subprocess.Popen, log: str) -> dict:
    def recorded() -> dict | None:
        records = {r["seq"]: r for r in book.passes()} if book.path.exists() else {}
        if seq not in records:
            assert job.poll() is None, f"the job ended ({job.returncode}): {log}"
        return records.get(seq)

    return wait_until(recorded, 120, f"pass {seq} in the ledger", interval=0.1)


def _scale(log_dir, workers: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "scale", str(log_dir), "--workers",
         str(workers), "--json"], env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_launched_online_job_grows_to_3_workers_and_back(tmp_path):
    stream = tmp_path / "stream"
    write_stream(stream, start_day="20240101", days=1, splits_per_day=PASSES,
                 rows_per_split=ROWS_PER_FILE * FILES_PER_SPLIT, files_per_split=FILES_PER_SPLIT,
                 skip=tuple(("20240101", s) for s in range(PASSES)), seed=5)  # fmt: skip
    path = write_config(tmp_path / "job.yaml", data_root=stream, model_dir=tmp_path / "model",
                        days=1, passes_per_day=PASSES, job={"mode": "async", "worker_num": 2},
                        save={"delta_every": 1, "checkpoint_every": 2})  # fmt: skip
    config = load_config(path)
    layout, book = DataLayout(config), Ledger.of(config.model_dir)
    out = tmp_path / "online.log"
    with open(out, "w") as log:
        job = subprocess.Popen(online_argv(path), env=clean_env(), stdout=log,
                               stderr=subprocess.STDOUT, cwd=tmp_path)  # fmt: skip
    try:
        _ready(layout, 0)
        _wait_pass(book, 0, job, str(out))
        grown = _scale(config.log_dir, 3)
        assert (grown["workers_before"], grown["workers_after"]) == (2, 3)
        assert grown["workers_started"] == [2]
        for seq in (1, 2):
            _ready(layout, seq)
            _wait_pass(book, seq, job, out.read_text()[-3000:])
        shrunk = _scale(config.log_dir, 2)
        assert (shrunk["workers_before"], shrunk["workers_after"]) == (3, 2)
        for seq in (3, 4):
            _ready(layout, seq)
        assert job.wait(120) == 0, out.read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)

    passes = book.passes()
    assert [r["seq"] for r in passes] == list(range(PASSES))
    assert [r["seq"] for r in book.records() if r["kind"] == "pass"] == list(range(PASSES))
    workers = [r["workers"] for r in passes]
    # 2 for pass 0, 3 from pass 1 or 2 on, 3 for pass 2, 2 again from pass 3 or 4 on
    assert workers[0] == 2 and workers[2] == 3 and workers[4] == 2, workers
    assert workers == sorted(workers[:3]) + sorted(workers[3:], reverse=True), workers
    per_pass = ROWS_PER_FILE * FILES_PER_SPLIT
    for record in passes:
        assert record["samples"] == per_pass, record  # each pass's rows, exactly
        assert record["eval"]["count"] == per_pass
        expected = {2: [2 * ROWS_PER_FILE, ROWS_PER_FILE], 3: [ROWS_PER_FILE] * 3}
        assert record["worker_rows"] == expected[record["workers"]]  # worker 2 took its third
    assert [r["passes"] for r in passes] == list(range(1, PASSES + 1))
    pids = json.loads((config.log_dir / "pids.json").read_text())["children"]
    assert {c["rank"] for c in pids if c["role"] == "worker"} == {0, 1, 2}
