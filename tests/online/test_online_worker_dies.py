"""Must-show of issue 23 (a worker's death): a launched async online job (3 workers,
``data.split: steal``, ``data.lease_s``) whose worker 1 is SIGKILLed mid-pass goes on with
2 workers and exits 0.

Synchronisation without sleeps that race: every file goes through a ``pipe_command`` that
marks its claim and then waits for a gate file, so each of the 3 workers claims exactly
one of pass 0's 3 files (a worker holds at most ``threads`` = 1 file it has not handed
out) before the test opens the gate; worker 1 kills itself when its trainer's reader takes
batch 2 of its file (``_leave_job.py``). The survivors meet at the pass's fence, which
waits for the launcher's record of the leave, re-form their group, re-read worker 1's
file from its start and finish the pass. The ledger: each pass once, every row of every
file trained at least once, ``rows_reread`` = the 2 batches worker 1 had taken.

Then the job grows back: once the launcher has recorded the leave, ``sparseps scale
--workers 3`` starts rank 3 (rank 1 is never used again) while every later file read waits
for a second gate (so pass 0 cannot end before the scale), and pass 1 runs on workers 0, 2
and 3.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _onlinetools import clean_env, write_config

from sparseps.launch import scale_job
from sparseps.online import DataLayout, Ledger, load_config, write_stream
from sparseps.online.online_cli import launch_argv
from sparseps.testing import wait_until

pytestmark = pytest.mark.timeout(180)

ROWS_PER_FILE, FILES, BATCH, KILL_BATCH, PASSES = 150, 3, 32, 2, 2


def _rows(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line)


def test_a_worker_killed_mid_pass_leaves_and_the_survivors_finish_every_pass(tmp_path):
    stream, claims, gate = tmp_path / "stream", tmp_path / "claims", tmp_path / "gate"
    regrown = tmp_path / "gate2"
    claims.mkdir()
    write_stream(stream, start_day="20240101", days=1, splits_per_day=PASSES,
                 rows_per_split=ROWS_PER_FILE * FILES, files_per_split=FILES, seed=7)  # fmt: skip
    # pass 0's first 3 claims wait for `gate`, every later one (the re-read of worker 1's
    # file, pass 1's) for `gate2`, opened once the scale after the death is done
    folder = shlex.quote(str(claims))
    pipe = (f"mktemp {folder}/c.XXXXXX >/dev/null; g={shlex.quote(str(gate))}; "
            f"if [ $(ls {folder} | wc -l) -gt {FILES} ]; then g={shlex.quote(str(regrown))}; fi; "
            "while [ ! -e $g ]; do sleep 0.02; done; cat")  # fmt: skip
    path = write_config(
        tmp_path / "job.yaml", data_root=stream, model_dir=tmp_path / "model", days=1,
        passes_per_day=PASSES, job={"mode": "async", "worker_num": 3},
        data={"split": "steal", "lease_s": 2.0, "batch_size": BATCH, "pipe_command": pipe},
        save={"delta_every": 1, "checkpoint_every": 1},
    )  # fmt: skip
    config = load_config(path)
    config.model_dir.mkdir(parents=True, exist_ok=True)
    argv = launch_argv(config, path, script=Path(__file__).with_name("_leave_job.py"),
                       script_args=[1, 0, KILL_BATCH])  # fmt: skip
    out = tmp_path / "launch.log"
    start = time.monotonic()
    with open(out, "w") as log:
        job = subprocess.Popen([sys.executable, "-m", "sparseps.cli", "launch", *argv],
                               env=clean_env(), stdout=log, stderr=subprocess.STDOUT,
                               cwd=tmp_path)  # fmt: skip
    try:
        deadline = time.monotonic() + 120

        def running(condition):
            def check() -> bool:
                assert job.poll() is None, out.read_text()[-3000:]
                return condition()

            return check

        # each worker holds one of pass 0's files
        claimed = running(lambda: len(list(claims.iterdir())) >= FILES)
        wait_until(claimed, 120, "the workers to claim pass 0's files")
        gate.touch()
        left = running(lambda: "LEFT the job" in out.read_text())  # the launcher recorded it
        wait_until(left, max(0.0, deadline - time.monotonic()), "worker 1's death recorded")
        report = scale_job(config.log_dir, workers=3, timeout_s=60)
        assert report["workers_started"] == [3] and report["members"] == [0, 2, 3], report
        assert report["left"] == [1] and report["workers_before"] == 2, report
        regrown.touch()
        assert job.wait(150) == 0, out.read_text()[-4000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    seconds = time.monotonic() - start

    book = Ledger.of(config.model_dir)
    assert [r["seq"] for r in book.records() if r["kind"] == "pass"] == list(range(PASSES))
    first, second = book.passes()
    layout = DataLayout(config)
    files = sorted(str(f) for d in layout.splits(layout.passes()[0]) for f in d.glob("part-*"))
    per_pass = sum(_rows(Path(f)) for f in files)
    assert per_pass == ROWS_PER_FILE * FILES
    # pass 0: loaded by 3 workers (one file each), worker 1 left after 2 batches
    assert first["workers"] == 3 and first["worker_rows"] == [ROWS_PER_FILE] * FILES, first
    (left,) = first["left"]
    assert left["rank"] == 1 and len(left["files"]) == 1 and left["files"][0] in files, left
    partial = KILL_BATCH * BATCH  # the rows worker 1 had taken from its file
    assert left["rows"] == partial < _rows(Path(left["files"][0])), left
    assert first["rows_reread"] == partial
    assert first["samples"] == per_pass  # the survivors trained every file's rows once
    assert first["eval"]["count"] == per_pass
    assert first["rows_trained"] == per_pass + partial
    assert first["workers_after"] == 2 and first["members"] == [0, 2]
    # pass 1: the two survivors and rank 3 (grown back), every row once, nobody left
    assert second["workers"] == 3 and second["samples"] == per_pass, second
    assert "left" not in second and "rows_reread" not in second
    assert [r["passes"] for r in (first, second)] == [1, 2]
    launcher = out.read_text()
    assert "LEFT the job" in launcher, launcher[-3000:]
    pids = json.loads((config.log_dir / "pids.json").read_text())["children"]
    assert [c["rank"] for c in pids if c["role"] == "worker"] == [0, 1, 2, 3]  # no restart
    print(f"worker death: job of {PASSES} passes done in {seconds:.1f} s")
