"""Crash and resume, deterministically: worker 0 exits at a named point of the pass loop
(sparseps.testing.crash.CrashPoint), the model directory is checked as the crash left it,
then ``sparseps online`` resumes; the final model and the effective ledger equal an
uninterrupted run's. Sync mode, 5 passes in one day, a checkpoint every 2 passes (after
seq 1 and 3, and seq 4 at the end of the day)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from _onlinetools import (
    checkpoint_arrays,
    history,
    run_crashing,
    run_online,
    write_config,
)

from sparseps.online import Ledger, write_stream
from sparseps.online.model_dir import ModelDir
from sparseps.testing.crash import CRASH_EXIT_CODE

pytestmark = pytest.mark.timeout(400)

KNOBS = {"save": {"checkpoint_every": 2, "keep_checkpoints": 10}}
FINAL = "000004-20240101-004"


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _inference(model: ModelDir) -> list[str]:
    return [path.name for _, _, path in model.inference_saves()]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    root = tmp_path_factory.mktemp("online-resume")
    write_stream(root / "data", start_day="20240101", days=1, splits_per_day=5,
                 rows_per_split=500, seed=3)  # fmt: skip
    return root


@pytest.fixture(scope="module")
def reference(stream):
    """The uninterrupted run."""
    cfg = write_config(stream / "ref.yaml", data_root=stream / "data", model_dir=stream / "ref",
                       days=1, passes_per_day=5, **KNOBS)  # fmt: skip
    _ok(run_online(cfg))
    return stream / "ref"


def test_uninterrupted_run_decays_at_the_end_of_the_day(reference):
    records = Ledger.of(reference).passes()
    assert [r.get("decay_rate") for r in records] == [None] * 4 + [0.98]
    before = checkpoint_arrays(reference / "checkpoints/000003-20240101-003")
    after = checkpoint_arrays(reference / f"checkpoints/{FINAL}")
    for table in ("deep_emb", "wide_emb"):
        name = f"{table}.shard-00000-of-00001.arrow"
        keys, show = after[f"{name}:key"], after[f"{name}:show"].astype(np.float64)
        # before the day's end every show is a whole count of pushes; the end of the day
        # multiplied each count by 0.98: show / 0.98 is whole again, and at least what it
        # was after pass 4 (pass 5 only adds); most shows are no longer whole numbers
        counts = show / 0.98
        np.testing.assert_allclose(counts, np.round(counts), atol=1e-3, err_msg=table)
        old_show = before[f"{name}:show"]
        assert np.array_equal(old_show, np.round(old_show)), table
        known = np.isin(keys, before[f"{name}:key"])
        assert np.all(np.round(counts[known]) >= old_show[np.isin(before[f"{name}:key"], keys)]), (
            table
        )
        fractional = np.mean(np.abs(show - np.round(show)) > 1e-3)
        print(f"\n{table}: {keys.size} rows, {fractional:.0%} with a decayed (fractional) show")
        assert fractional > 0.5, table


@pytest.mark.parametrize(
    ("phase", "seq", "batches", "ledger", "checkpoints", "inference", "resume"),
    [
        # killed while training pass 3: passes 1-2 recorded and checkpointed
        ("train_batch", 2, 2, [0, 1], [1], ["base-00000", "delta-00001"], 1),
        # pass 3 recorded, but no checkpoint holds it: it is superseded and trained again
        ("ledger_written", 2, 1, [0, 1, 2], [1], ["base-00000", "delta-00001", "delta-00002"], 1),
        # killed inside pass 4's checkpoint save (shards written, no manifest)
        ("mid_checkpoint", 3, 1, [0, 1, 2], [1],
         ["base-00000", "delta-00001", "delta-00002", "delta-00003"], 1),
        # pass 4's checkpoint complete, its ledger line not written: restored from the checkpoint
        ("checkpointed", 3, 1, [0, 1, 2], [1, 3],
         ["base-00000", "delta-00001", "delta-00002", "delta-00003"], 3),
    ],
)  # fmt: skip
def test_crash_and_resume_equals_uninterrupted_run(
    stream, reference, tmp_path, phase, seq, batches, ledger, checkpoints, inference, resume
):
    cfg = write_config(tmp_path / "crash.yaml", data_root=stream / "data",
                       model_dir=tmp_path / "crash", days=1, passes_per_day=5, **KNOBS)  # fmt: skip
    crashed = run_crashing(cfg, phase, seq, batches)
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stdout[-3000:] + crashed.stderr[-3000:]

    # the model directory exactly as the crash left it
    model, book = ModelDir(tmp_path / "crash"), Ledger.of(tmp_path / "crash")
    assert [r["seq"] for r in book.passes()] == ledger
    assert all(r["kind"] == "pass" for r in book.records())
    assert [s["online"]["seq"] for _, s in model.complete_checkpoints()] == checkpoints
    assert _inference(model) == inference
    assert json.loads(model.status_path.read_text())["state"] == "running"

    _ok(run_online(cfg))
    resumes = [r for r in book.records() if r["kind"] == "resume"]
    assert [(r["seq"], r["checkpoint"]) for r in resumes] == [
        (resume, str(model.checkpoint_path(model_pass(resume))))
    ]
    assert history(book.passes()) == history(Ledger.of(reference).passes())
    # every pass after the resumed checkpoint was trained exactly once more
    trained = [r["seq"] for r in book.records() if r["kind"] == "pass"]
    assert trained == ledger + ([resume] if resume not in ledger else []) + list(
        range(resume + 1, 5)
    )
    assert json.loads(model.status_path.read_text())["state"] == "completed"
    assert all((p / "MANIFEST.json").is_file() for p in model.checkpoints.iterdir())
    assert _inference(model) == _inference(ModelDir(reference))

    ref_arrays = checkpoint_arrays(reference / f"checkpoints/{FINAL}")
    arrays = checkpoint_arrays(tmp_path / f"crash/checkpoints/{FINAL}")
    assert sorted(arrays) == sorted(ref_arrays)
    for name, ref in ref_arrays.items():
        np.testing.assert_array_equal(arrays[name], ref, err_msg=name)
    print(f"\ncrash at {phase} of seq {seq}: resumed after seq {resume}; final checkpoints "
          f"equal ({len(arrays)} arrays, {arrays['deep_emb.shard-00000-of-00001.arrow:key'].size}"
          f" deep rows)")  # fmt: skip


def model_pass(seq: int):
    from sparseps.online.layout import PassId

    return PassId(seq, "20240101", seq)
