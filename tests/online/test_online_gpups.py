"""``sparseps online`` with ``job.mode: gpups`` (issue 56, item 5): each pass's rows on the
workers' devices (device "cpu" here), written back to the servers at its end, so the
ledger, checkpoints, base/delta saves and crash-resume work as in sync mode, each pass
prepared while the one before trains (its keys read and rows pulled). GPUPS is sync's
lock-step over device tables, so a job killed in pass 2's training and rerun ends with
the uninterrupted job's final checkpoint bit for bit, with an exact ledger."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _fakes import FakeDriver, FakeTrainer, fake_config
from _onlinetools import checkpoint_arrays, history, run_crashing, run_online, write_config

from sparseps.online import Ledger, write_stream
from sparseps.online.config_job import JobConfig
from sparseps.online.config_mode import deterministic
from sparseps.online.model_dir import ModelDir
from sparseps.testing.crash import CRASH_EXIT_CODE

pytestmark = pytest.mark.timeout(900)

PASSES = 3
JOB = {"mode": {"name": "gpups", "device": "cpu"}}


def _config(root, name: str):
    return write_config(
        root / f"{name}.yaml", data_root=root / "data", model_dir=root / name, days=1,
        passes_per_day=PASSES, job=JOB, save={"checkpoint_every": 1, "keep_checkpoints": 10},
    )  # fmt: skip


def _ok(result) -> None:
    assert result is not None
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_a_gpups_online_job_killed_mid_pass_and_rerun_ends_with_the_same_model(tmp_path):
    assert deterministic(JobConfig(**JOB).training_mode)
    write_stream(tmp_path / "data", start_day="20240101", days=1, splits_per_day=PASSES,
                 rows_per_split=3000, seed=7)  # fmt: skip
    reference = run_online(_config(tmp_path, "ref"), timeout=300)
    _ok(reference)
    config = _config(tmp_path, "crash")
    crashed = run_crashing(config, "train_batch", 1, 2, timeout=300)
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    _ok(run_online(config, timeout=300))
    ours, theirs = Ledger.of(tmp_path / "crash").passes(), Ledger.of(tmp_path / "ref").passes()
    assert [r["seq"] for r in ours] == list(range(PASSES)) == [r["seq"] for r in theirs]
    book = Ledger.of(tmp_path / "crash").records()
    assert [r["seq"] for r in book if r["kind"] == "resume"] == [0]
    assert json.loads(ModelDir(tmp_path / "crash").status_path.read_text())["state"] == "completed"
    assert history(ours) == history(theirs)  # the same saves and progressive metrics
    # each pass after the first was prepared while the one before trained, once its data
    # was loaded (a load that ends after the pass leaves the next pass unprepared: rare)
    prepared = [r["prepared"] for r in theirs]
    assert prepared[0] is False and any(prepared[1:]), prepared
    final = f"checkpoints/{PASSES - 1:06d}-20240101-{PASSES - 1:03d}"
    want = checkpoint_arrays(tmp_path / "ref" / final)
    got = checkpoint_arrays(tmp_path / "crash" / final)
    assert sorted(got) == sorted(want) and want
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert theirs[-1]["eval"]["auc"] > 0.55  # it learned


@pytest.mark.parametrize("preload", [True, False])
def test_the_driver_prepares_each_loaded_next_pass_while_a_pass_trains(tmp_path, preload):
    """With ``data.preload`` the next pass's data loads while a pass trains, and the first
    batch after it is loaded hands it to ``Trainer.prefetch_pass`` (the GPUPS pipeline;
    loading sleeps 0.2 s, a pass's 3 batches 1 s in all); without preload nothing is."""
    config = fake_config(tmp_path, days=1, passes_per_day=3, data={"preload": preload})
    trainer = FakeTrainer(train_s=1.0)
    FakeDriver(config, trainer, load_s=0.2).run()
    trained = [call[1] for call in trainer.calls if call[0] == "evaluate"]
    assert len(trained) == 3
    assert trainer.prepared == (trained[1:] if preload else [])
