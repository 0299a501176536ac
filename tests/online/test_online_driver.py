"""The pass loop in one process (fake trainer): order of work, saves, phases, preload,
restart and inference retention."""

from __future__ import annotations

import shutil

import pytest
from _fakes import FakeDriver, FakeTrainer, fake_config

from sparseps.online import Ledger
from sparseps.online.model_dir import ModelDir
from sparseps.online.schedule import plan_days


def _passes(calls):
    """The trainer's calls cut into one list per pass (a pass starts with evaluate)."""
    out = []
    for call in calls:
        if call[0] == "evaluate":
            out.append([])
        out[-1].append(call[0])
    return out


def test_driver_runs_the_planned_saves_evaluating_before_training(tmp_path):
    config = fake_config(tmp_path, days=2, passes_per_day=5,
                         save={"delta_every": 2, "checkpoint_every": 3,
                               "keep_checkpoints": 10, "keep_bases": 10})  # fmt: skip
    trainer = FakeTrainer()
    records = FakeDriver(config, trainer).run()
    expected = []
    for day in plan_days([5, 5], delta_every=2, checkpoint_every=3):
        for plan in day:
            steps = ["evaluate", "train"]
            steps += ["decay", "shrink"] if plan.end_of_day else []
            steps += [plan.inference] if plan.inference else []
            steps += ["checkpoint"] if plan.checkpoint else []
            expected.append(steps)
    assert _passes(trainer.calls) == expected
    # the pass's own data is evaluated first, then trained on
    names = [c[1] for c in trainer.calls if c[0] == "evaluate"]
    assert names == [f"2024010{d}/00{m:02d}" for d in (1, 2) for m in (0, 5, 10, 15, 20)]
    assert [c[1] for c in trainer.calls if c[0] == "decay"] == [config.model.decay_rate] * 2
    assert [r["decay_rate"] for r in records if "decay_rate" in r] == [0.98, 0.98]
    assert [r["seq"] for r in Ledger.of(config.model_dir).passes()] == list(range(10))
    model = ModelDir(config.model_dir)
    assert [p.name for p, _ in model.complete_checkpoints()] == [
        "000002-20240101-002", "000004-20240101-004", "000007-20240102-002", "000009-20240102-004"
    ]  # fmt: skip
    assert [f"{k}-{s}" for s, k, _ in model.inference_saves()] == [
        "base-0", "delta-1", "base-2", "delta-3", "delta-4", "base-5"
    ]  # fmt: skip


def test_phase_hook_sees_every_phase_in_order(tmp_path):
    config = fake_config(tmp_path, days=1, passes_per_day=2,
                         save={"delta_every": 1, "checkpoint_every": 2})  # fmt: skip
    events = []
    FakeDriver(config, FakeTrainer(), batches=2, on_phase=events.append).run()
    assert [(e.pass_id.seq, e.phase, e.batches) for e in events] == [
        (0, "pass_start", 0), (0, "evaluated", 0), (0, "train_batch", 1), (0, "train_batch", 2),
        (0, "trained", 0), (0, "inference_saved", 0), (0, "ledger_written", 0),
        (1, "pass_start", 0), (1, "evaluated", 0), (1, "train_batch", 1), (1, "train_batch", 2),
        (1, "trained", 0), (1, "inference_saved", 0), (1, "checkpoint", 0),
        (1, "checkpointed", 0), (1, "ledger_written", 0),
    ]  # fmt: skip
    assert {e.rank for e in events} == {0}


@pytest.mark.parametrize("preload", [True, False])
def test_preloading_hides_the_load_behind_training(tmp_path, preload):
    # loading sleeps 0.4 s, training 1.0 s: with preload the next pass is in memory long
    # before the current one ends, so only the first pass waits for its data
    config = fake_config(tmp_path, days=1, passes_per_day=3, data={"preload": preload})
    records = FakeDriver(config, FakeTrainer(train_s=1.0), load_s=0.4).run()
    load = [r["load_s"] for r in records]
    wait = [r["data_wait_s"] for r in records]
    print(f"\npreload={preload}: load_s {load}, data_wait_s {wait}")
    assert all(s >= 0.4 for s in load)
    assert wait[0] >= 0.3  # nothing to overlap with: the first pass waits either way
    if preload:
        assert all(w < 0.25 * s for w, s in zip(wait[1:], load[1:], strict=True))
    else:
        assert all(w >= 0.75 * s for w, s in zip(wait, load, strict=True))


def test_restart_continues_after_the_newest_checkpoint(tmp_path):
    config = fake_config(tmp_path, days=1, passes_per_day=5, save={"checkpoint_every": 2})
    FakeDriver(config, FakeTrainer()).run()
    ledger = Ledger.of(config.model_dir)
    # nothing left to do: a second run loads the last checkpoint and trains nothing
    trainer = FakeTrainer()
    assert FakeDriver(config, trainer).run() == []
    assert trainer.calls == [("load", "000004-20240101-004")]
    assert [r["seq"] for r in ledger.passes()] == [0, 1, 2, 3, 4]
    assert [r["kind"] for r in ledger.records()][-1] == "resume"


def test_inference_retention_keeps_the_newest_bases_and_their_chains(tmp_path):
    config = fake_config(tmp_path, days=3, passes_per_day=3,
                         save={"delta_every": 1, "checkpoint_every": 3, "keep_bases": 2})  # fmt: skip
    FakeDriver(config, FakeTrainer()).run()
    model = ModelDir(config.model_dir)
    # saves: base-0 delta-1 base-2 | delta-3 delta-4 base-5 | delta-6 delta-7 base-8;
    # the two newest bases are 5 and 8, so 0..4 are gone
    assert [f"{k}-{s}" for s, k, _ in model.inference_saves()] == [
        "base-5", "delta-6", "delta-7", "base-8"
    ]  # fmt: skip
    from sparseps.checkpoint.inference import chain

    assert [p.name for p in chain(model.inference)] == ["base-00008"]


def test_prune_inference_counts_only_bases_a_checkpoint_covers(tmp_path):
    config = fake_config(tmp_path, days=1, passes_per_day=1)
    model = ModelDir(config.model_dir)
    trainer = FakeTrainer()
    for mode in ("base", "delta", "base", "delta", "base", "delta"):
        trainer.save_inference_model(model.inference, mode=mode)
        trainer.passes += 1
    (model.inference / "delta-00006").mkdir()  # an incomplete save (no manifest) is kept
    names = lambda: [p.name for _, _, p in model.inference_saves()]  # noqa: E731
    # base-00004 holds passes=4, newer than the checkpoint (passes=3): it does not count,
    # so keeping 2 bases keeps base-00000 and base-00002
    assert model.prune_inference(2, covered_passes=3) == []
    gone = model.prune_inference(1, covered_passes=3)
    assert [p.name for p in gone] == ["base-00000", "delta-00001"]
    assert names() == ["base-00002", "delta-00003", "base-00004", "delta-00005", "delta-00006"]
    model.prune_inference(1, covered_passes=10)
    assert names() == ["base-00004", "delta-00005", "delta-00006"]
    with pytest.raises(Exception, match="keep_bases must be >= 1"):
        model.prune_inference(0, covered_passes=10)


def test_staging_folders_of_interrupted_saves_never_count_and_are_cleaned(tmp_path):
    config = fake_config(tmp_path, days=1, passes_per_day=2, save={"checkpoint_every": 1})
    FakeDriver(config, FakeTrainer()).run()
    model = ModelDir(config.model_dir)
    done = model.checkpoints / "000001-20240101-001"
    # a save that stopped after its manifest but before the rename into place, and one
    # that stopped before its manifest
    staged = model.checkpoints / ".000002-20240102-000.saving-1-abc"
    shutil.copytree(done, staged)
    (model.checkpoints / "000003-20240102-001").mkdir()
    assert [p.name for p, _ in model.complete_checkpoints()] == [
        "000000-20240101-000", "000001-20240101-001"
    ]  # fmt: skip
    model.clean_incomplete()
    assert sorted(p.name for p in model.checkpoints.iterdir()) == [
        "000000-20240101-000", "000001-20240101-001"
    ]  # fmt: skip
