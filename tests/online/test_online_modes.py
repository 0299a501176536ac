"""Every Strategy mode in ``sparseps online`` (issue 57, item 2): heter, hybrid, bounded
staleness and backup workers next to sync, async and geo; killed mid-pass and rerun, each
keeps an exact ledger and ends within the documented bound of an uninterrupted run
(docs/online.md, "Modes"; sync's bit-for-bit resume is tests/online/test_online_resume.py)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _onlinetools import checkpoint_arrays, history, run_crashing, run_online, write_config

from sparseps.errors import ConfigError
from sparseps.online import Ledger, write_stream
from sparseps.online.config_job import JobConfig
from sparseps.online.config_mode import deterministic, mode_from_config
from sparseps.online.model_dir import ModelDir
from sparseps.online.online_cli import launch_argv
from sparseps.testing.crash import CRASH_EXIT_CODE

pytestmark = pytest.mark.timeout(900)

PASSES = 4
# the documented bound (docs/online.md, "Modes"): |AUC of the last pass's progressive
# evaluation, crashed and rerun - uninterrupted| for a mode that is not deterministic. On
# streams this short the model is still learning and these modes are a draw: two
# UNINTERRUPTED runs of this job differed by 0.042 (heter: how many dense updates gathering
# makes depends on timing) and 0.048 (hybrid); reruns measured up to 0.039 (heter), 0.040
# (hybrid), 0.011 (bounded staleness), 0.010 (backup workers) away. With dense Adam at
# 0.003 the last pass was still far from learnt and a heter rerun once ended 0.165 away
AUC_BOUND = 0.15

MODES = {  # name: the job section
    "heter": {"mode": "heter", "heter_worker_num": 1},
    "heter_sync": {"mode": {"name": "heter", "sync": True}, "heter_worker_num": 1},
    "hybrid": {"mode": "hybrid"},
    "bounded_staleness": {"mode": {"name": "async", "max_staleness": 2}},
    "backup_workers": {"mode": {"name": "sync", "backup_workers": 1}},
}


def test_job_mode_takes_every_mode_with_its_knobs():
    assert mode_from_config("sync").name == "sync"
    assert mode_from_config({"name": "async", "max_staleness": 3}).max_staleness == 3
    assert mode_from_config({"name": "sync", "backup_workers": 1}).backup_workers == 1
    assert mode_from_config({"name": "heter", "gather_rows": 0}).gather_rows == 0
    assert mode_from_config("hybrid").name == "hybrid"
    assert deterministic(mode_from_config("sync"))
    assert not deterministic(mode_from_config({"name": "sync", "backup_workers": 1}))
    assert not deterministic(mode_from_config("heter"))
    assert deterministic(mode_from_config({"name": "heter", "sync": True}))
    cases = [
        ({"mode": "fast"}, "expected one of"),
        ({"mode": {"name": "async", "k_steps": 3}}, r"unknown knob\(s\) \['k_steps'\]"),
        ({"mode": {"name": "async", "max_staleness": -1}}, "Async.max_staleness"),
        ({"mode": {"max_staleness": 1}}, "needs 'name'"),
        ({"mode": 3}, "expected a mode name"),
        ({"mode": "heter"}, "needs heter workers"),
        ({"mode": "sync", "heter_worker_num": 1}, "not of sync"),
        ({"mode": "async", "heter_device": "cuda"}, "no heter workers"),
        ({"mode": "heter", "heter_worker_num": 1, "heter_device": "tpu"}, "job.heter_device"),
    ]
    for job, message in cases:
        with pytest.raises(ConfigError, match=message):
            JobConfig(**job)


def test_a_heter_job_launches_its_heter_workers(tmp_path):
    config = write_config(tmp_path / "c.yaml", data_root=tmp_path / "data", model_dir=tmp_path / "m",
                          days=1, passes_per_day=1,
                          job={"mode": "heter", "heter_worker_num": 2, "heter_device": "cpu"})  # fmt: skip
    from sparseps.online.config import load_config

    argv = launch_argv(load_config(config), config)
    assert argv[argv.index("--heter-worker-num") + 1] == "2"
    assert argv[argv.index("--heter-device") + 1] == "cpu"


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    root = tmp_path_factory.mktemp("online-modes")
    write_stream(root / "data", start_day="20240101", days=1, splits_per_day=PASSES,
                 rows_per_split=4000, seed=5)  # fmt: skip
    return root


def _config(stream, name: str, job: dict):
    # delta_every 0: no inference save but the end of the day's base. The modes differ in
    # training, not in saving; each save exports the head on worker 0 (~0.2 s of CPU where
    # a zygote warmed torch.export, ~1.5 s more where not), which the killed runs then
    # never pay and the others pay once
    return write_config(
        stream / f"{name}.yaml", data_root=stream / "data", model_dir=stream / name, days=1,
        passes_per_day=PASSES, job=job,
        save={"checkpoint_every": 1, "keep_checkpoints": 10, "delta_every": 0},
        model={"dense_lr": 0.01},
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(stream):
    """Per mode: an uninterrupted run, and a run killed in pass 2's training then rerun."""

    def killed_and_rerun(name: str, job: dict) -> dict:
        cfg = _config(stream, name, job)
        crashed = run_crashing(cfg, "train_batch", 1, 2, timeout=300)
        resumed = run_online(cfg, timeout=300) if crashed.returncode == CRASH_EXIT_CODE else None
        return {"crashed": crashed, "resumed": resumed}

    def uninterrupted(name: str, job: dict) -> dict:
        return {"reference": run_online(_config(stream, f"{name}-ref", job), timeout=300)}

    # two jobs at a time; the pairs of jobs first, then the single ones: with one task of
    # three jobs per mode, the last mode ran alone for about a quarter of the module
    with ThreadPoolExecutor(max_workers=2) as pool:
        pairs = {name: pool.submit(killed_and_rerun, name, job) for name, job in MODES.items()}
        singles = {name: pool.submit(uninterrupted, name, job) for name, job in MODES.items()}
        return {name: pairs[name].result() | singles[name].result() for name in MODES}


def _ok(result: subprocess.CompletedProcess | None) -> None:
    assert result is not None
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("name", list(MODES))
def test_killed_mid_pass_and_rerun_keeps_the_ledger_and_the_bound(stream, runs, name):
    run = runs[name]
    _ok(run["reference"])
    crashed = run["crashed"]
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    _ok(run["resumed"])
    reference, book = Ledger.of(stream / f"{name}-ref"), Ledger.of(stream / name)
    # exactly once: every pass recorded once in the effective ledger, in order, with the
    # same saves; pass 2 (seq 1) trained twice (killed, then rerun from seq 0's checkpoint)
    ours, theirs = book.passes(), reference.passes()
    assert [r["seq"] for r in ours] == list(range(PASSES)) == [r["seq"] for r in theirs]
    shape = [(h[0], h[1], h[2], h[3], h[6]) for h in history(ours)]
    assert shape == [(h[0], h[1], h[2], h[3], h[6]) for h in history(theirs)]
    trained = [r["seq"] for r in book.records() if r["kind"] == "pass"]
    assert trained == [0, *range(1, PASSES)]
    resumes = [r["seq"] for r in book.records() if r["kind"] == "resume"]
    assert resumes == [0]
    assert json.loads(ModelDir(stream / name).status_path.read_text())["state"] == "completed"
    if deterministic(JobConfig(**MODES[name]).training_mode):  # the same model, bit for bit
        assert history(ours) == history(theirs)
        final = f"checkpoints/{PASSES - 1:06d}-20240101-{PASSES - 1:03d}"
        want = checkpoint_arrays(stream / f"{name}-ref" / final)
        got = checkpoint_arrays(stream / name / final)
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        print(f"\n{name}: final checkpoints equal bit for bit ({len(got)} arrays)")
        return
    # the model: the last pass's progressive AUC within the bound of the uninterrupted run's
    gap = abs(ours[-1]["eval"]["auc"] - theirs[-1]["eval"]["auc"])
    print(f"\n{name}: progressive AUC per pass, rerun {[round(r['eval']['auc'], 4) for r in ours]}"
          f", uninterrupted {[round(r['eval']['auc'], 4) for r in theirs]}")  # fmt: skip
    print(f"\n{name}: last-pass AUC {ours[-1]['eval']['auc']:.4f} (rerun) vs "
          f"{theirs[-1]['eval']['auc']:.4f} (uninterrupted), gap {gap:.4f}")  # fmt: skip
    assert gap <= AUC_BOUND
    assert min(ours[-1]["eval"]["auc"], theirs[-1]["eval"]["auc"]) > 0.55  # both learned
