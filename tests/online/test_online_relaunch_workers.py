"""The relaunch path of issue 23 (workers): an online job stopped after a pass and run
again with another ``job.worker_num`` continues at the next pass with a consistent ledger.

Any mode (this one is sync, which cannot change workers while running): the rerun loads
the newest checkpoint onto its workers, and the next pass's files are split over the new
count. Day 1 (one pass) runs on 1 worker, then the same model directory with the
schedule extended by a day runs day 2 on 2 workers (a rerun starts every process anew, so
the test keeps to few of them).
"""

from __future__ import annotations

import pytest
from _onlinetools import run_online, write_config

from sparseps.online import Ledger, write_stream

pytestmark = pytest.mark.timeout(240)

ROWS_PER_FILE, FILES_PER_SPLIT = 150, 2


def _config(tmp_path, *, days: int, workers: int):
    return write_config(
        tmp_path / f"job-{days}.yaml", data_root=tmp_path / "stream", model_dir=tmp_path / "model",
        days=days, passes_per_day=1, job={"mode": "sync", "worker_num": workers},
        save={"delta_every": 1, "checkpoint_every": 1},
    )  # fmt: skip


def test_rerun_with_another_worker_count_continues_at_the_next_pass(tmp_path):
    write_stream(tmp_path / "stream", start_day="20240101", days=2, splits_per_day=1,
                 rows_per_split=ROWS_PER_FILE * FILES_PER_SPLIT, files_per_split=FILES_PER_SPLIT,
                 seed=9)  # fmt: skip
    first = run_online(_config(tmp_path, days=1, workers=1))
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_online(_config(tmp_path, days=2, workers=2))
    assert second.returncode == 0, second.stderr[-3000:]

    book = Ledger.of(tmp_path / "model")
    passes = book.passes()
    assert [r["seq"] for r in passes] == [0, 1]  # once each, none redone
    assert [r["seq"] for r in book.records() if r["kind"] == "pass"] == [0, 1]
    assert [r["workers"] for r in passes] == [1, 2]
    per_pass = ROWS_PER_FILE * FILES_PER_SPLIT
    assert [r["samples"] for r in passes] == [per_pass] * 2
    assert [r["eval"]["count"] for r in passes] == [per_pass] * 2
    assert [r["worker_rows"] for r in passes] == [[2 * ROWS_PER_FILE], [ROWS_PER_FILE] * 2]
    assert [r["passes"] for r in passes] == [1, 2]
    # the rerun trained on day 1's checkpoint (the model counts both passes)
    assert passes[0]["saved"]["checkpoint"] and passes[1]["saved"]["checkpoint"]
