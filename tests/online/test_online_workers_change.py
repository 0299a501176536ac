"""Issue 23 (workers): an online job continues across worker count changes between
passes with a consistent ledger, at exactly known boundaries.

The launcher's part is played by the test (``_elastic_jobs.grow_and_shrink``): pass 0 and
1 run on 2 workers, pass 2 on 3, pass 3 on 2 again. Each pass is in the ledger once, its
samples are exactly its rows, worker 2 loaded its static share of pass 2
(``files[2::3]``), and every process exits 0 (worker 2 at the boundary after pass 2).
The launched Must-show (``sparseps scale LOG_DIR --workers N`` on ``sparseps online``)
is test_online_scale_workers.py; ``split: steal`` is test_online_workers_steal.py.
"""

from __future__ import annotations

import pytest
from _elastic_jobs import FILES_PER_SPLIT, ROWS_PER_FILE, grow_and_shrink

pytestmark = pytest.mark.timeout(180)


def test_online_job_grows_and_shrinks_between_passes(tmp_path):
    passes = grow_and_shrink(tmp_path, "static")
    assert FILES_PER_SPLIT == 3
    # static split: worker r of w loaded files[r::w] of the pass; worker 2 took its third
    assert passes[2]["worker_rows"] == [ROWS_PER_FILE] * 3
    assert passes[1]["worker_rows"] == [2 * ROWS_PER_FILE, ROWS_PER_FILE]
    assert passes[3]["worker_rows"] == [2 * ROWS_PER_FILE, ROWS_PER_FILE]
    assert [r["passes"] for r in passes] == [1, 2, 3, 4]
    # saves as before: a delta each pass (base first), checkpoints after passes 1 and 3
    assert [sorted(r["saved"]) for r in passes] == [
        ["base"], ["checkpoint", "delta"], ["delta"], ["base", "checkpoint"]
    ]  # fmt: skip
