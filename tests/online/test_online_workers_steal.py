"""Workers joining and leaving with ``data.split: steal``: each pass's files come from a
queue named by the pass and the membership, so the new worker takes files from the pass
it joins, a pass loaded for the old workers and dropped leaves no ticket behind, and
every row of every pass is read exactly once (``_elastic_jobs.grow_and_shrink``: 1, 1, 2,
2 workers: a job launched with one worker grows live, and ends grown, every process with
exit 0; the growth 2 -> 3 -> 2 is test_online_scale_workers.py's)."""

from __future__ import annotations

import pytest
from _elastic_jobs import FILES_PER_SPLIT, ROWS_PER_FILE, grow_and_shrink

pytestmark = pytest.mark.timeout(180)


def test_stealing_online_job_reads_every_file_once_across_worker_changes(tmp_path):
    passes = grow_and_shrink(tmp_path, "steal", shrink=False, start=1)
    for record in passes:
        rows = record["worker_rows"]
        assert len(rows) == record["workers"]
        assert all(n % ROWS_PER_FILE == 0 for n in rows)  # whole files
        assert sum(rows) == ROWS_PER_FILE * FILES_PER_SPLIT  # none twice, none lost
