"""Online job: a crash during pass 3 of 5 and a restart equal an uninterrupted run."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from _onlinetools import (
    checkpoint_arrays,
    clean_env,
    history,
    kill_job,
    online_argv,
    run_online,
    wait_for,
    write_config,
)

from sparseps.online import Ledger, write_stream
from sparseps.online.model_dir import ModelDir

pytestmark = pytest.mark.timeout(300)


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_crash_and_resume_equals_uninterrupted_run(tmp_path):
    data = tmp_path / "data"
    write_stream(data, start_day="20240101", days=1, splits_per_day=5, rows_per_split=500, seed=3)
    knobs = {"save": {"checkpoint_every": 2, "keep_checkpoints": 10}}
    ref_cfg = write_config(tmp_path / "ref.yaml", data_root=data, model_dir=tmp_path / "ref",
                           days=1, passes_per_day=5, **knobs)  # fmt: skip
    _ok(run_online(ref_cfg))

    cfg = write_config(tmp_path / "crash.yaml", data_root=data, model_dir=tmp_path / "crash",
                       days=1, passes_per_day=5, **knobs)  # fmt: skip
    ledger = Ledger.of(tmp_path / "crash")
    proc = subprocess.Popen(online_argv(cfg), env=clean_env(), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        # pass 3 (seq 2) recorded but not yet in a checkpoint (those come after seq 1 and 3)
        wait_for(lambda: len(ledger.passes()) >= 3, 120, "the third pass record")
    finally:
        kill_job(proc, tmp_path / "crash" / "log")
    before = [r["seq"] for r in ledger.passes()]
    latest = ModelDir(tmp_path / "crash").latest_checkpoint()
    print(f"\nkilled with ledger passes {before}; newest checkpoint: seq "
          f"{latest[1]['online']['seq'] if latest else None}")  # fmt: skip
    assert before[:3] == [0, 1, 2] and latest is not None and latest[1]["online"]["seq"] < 4

    _ok(run_online(cfg))
    resumes = [r for r in ledger.records() if r["kind"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["seq"] == latest[1]["online"]["seq"]
    ref_ledger = Ledger.of(tmp_path / "ref").passes()
    assert history(ledger.passes()) == history(ref_ledger)
    assert [r["seq"] for r in ledger.passes()] == [0, 1, 2, 3, 4]

    ref_arrays = checkpoint_arrays(tmp_path / "ref/checkpoints/000004-20240101-004")
    arrays = checkpoint_arrays(tmp_path / "crash/checkpoints/000004-20240101-004")
    assert sorted(arrays) == sorted(ref_arrays)
    for name, ref in ref_arrays.items():
        np.testing.assert_array_equal(arrays[name], ref, err_msg=name)
    print(f"final checkpoints equal: {len(arrays)} arrays, "
          f"{arrays['deep_emb.shard-00000-of-00001.arrow:key'].size} deep rows; "
          f"progressive auc per pass {[round(r['eval']['auc'], 4) for r in ledger.passes()]}")  # fmt: skip
