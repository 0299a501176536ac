"""Crash and resume, deterministically: worker 0 exits at a named point of the pass loop
(sparseps.testing.crash.CrashPoint), the model directory is checked as the crash left it,
then ``sparseps online`` resumes; the final model and the effective ledger equal an
uninterrupted run's. Sync mode, 5 passes in one day, a checkpoint every 2 passes (after
seq 1 and 3, and seq 4 at the end of the day)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

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

# the first test's set-up runs all seven jobs of the module (see runs)
pytestmark = pytest.mark.timeout(600)

KNOBS = {"save": {"checkpoint_every": 2, "keep_checkpoints": 10}}
FINAL = "000004-20240101-004"


def _ok(result: subprocess.CompletedProcess | None) -> None:
    assert result is not None, "not run: a crash point before it was not reached"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _inference(model: ModelDir) -> list[str]:
    return [path.name for _, _, path in model.inference_saves()]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    root = tmp_path_factory.mktemp("online-resume")
    write_stream(root / "data", start_day="20240101", days=1, splits_per_day=5,
                 rows_per_split=500, seed=3)  # fmt: skip
    return root


# Each chain is one model directory: a run killed at the chain's first crash point, then
# `sparseps online` reruns that are themselves killed at the next point, then one that
# completes. Each crash is checked as it left the folder, each rerun by the records it
# appends (its resume record first) and the chain's end by the uninterrupted run's model.
# A rerun is killed at a point ahead of the pass it resumes after, so each point is still
# reached; 7 jobs instead of 9 (a crash and a rerun per point), and the reruns that are
# killed are checked as reruns too.
CHAINS = {  # name: the crash points (phase, seq, batches) of its runs, in order
    "train_batch+ledger_written": [("train_batch", 2, 2), ("ledger_written", 2, 1)],
    "mid_checkpoint+checkpointed": [("mid_checkpoint", 3, 1), ("checkpointed", 3, 1)],
}
CASES = {phase: (chain, step) for chain, points in CHAINS.items()
         for step, (phase, _, _) in enumerate(points)}  # fmt: skip


def _left_by_crash(folder, before: int) -> dict:
    """The model directory as a crash left it (read before the next run changes it);
    ``before``: the ledger's records before the killed run."""
    model, book = ModelDir(folder), Ledger.of(folder)
    return {
        "ledger": [r["seq"] for r in book.passes()],
        "appended": [(r["kind"], r["seq"]) for r in book.records()[before:]],
        "checkpoints": [s["online"]["seq"] for _, s in model.complete_checkpoints()],
        "inference": _inference(model),
        "state": json.loads(model.status_path.read_text())["state"],
        "records": len(book.records()),
    }


@pytest.fixture(scope="module")
def runs(stream):
    """The uninterrupted run and, per chain of CHAINS, its killed runs (each with the
    directory as it left it) and its last run: two jobs at a time (each job is mostly one
    busy process at a time - imports, one worker's save, start and stop - and sync mode
    makes every result independent of timing)."""

    def uninterrupted():
        cfg = write_config(stream / "ref.yaml", data_root=stream / "data",
                           model_dir=stream / "ref", days=1, passes_per_day=5, **KNOBS)  # fmt: skip
        return run_online(cfg)

    def chain(name, points):
        cfg = write_config(stream / f"{name}.yaml", data_root=stream / "data",
                           model_dir=stream / name, days=1, passes_per_day=5, **KNOBS)  # fmt: skip
        crashes, before = [], 0
        for phase, seq, batches in points:
            crashed = run_crashing(cfg, phase, seq, batches)
            if crashed.returncode != CRASH_EXIT_CODE:
                return crashes + [(crashed, None)], None
            left = _left_by_crash(stream / name, before)
            crashes.append((crashed, left))
            before = left["records"]
        return crashes, run_online(cfg)

    with ThreadPoolExecutor(max_workers=2) as pool:
        reference = pool.submit(uninterrupted)
        chains = {name: pool.submit(chain, name, points) for name, points in CHAINS.items()}
        return reference.result(), {name: future.result() for name, future in chains.items()}


@pytest.fixture(scope="module")
def reference(stream, runs):
    """The uninterrupted run."""
    _ok(runs[0])
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
    ("case", "ledger", "appended", "checkpoints", "inference", "resume", "rerun"),
    [
        # killed while training pass 3 of a fresh run: passes 1-2 recorded and checkpointed
        ("train_batch", [0, 1], [("pass", 0), ("pass", 1)], [1],
         ["base-00000", "delta-00001"], 1, [("pass", 2)]),
        # (the rerun of the one above) pass 3 recorded, but no checkpoint holds it: it is
        # superseded and trained again
        ("ledger_written", [0, 1, 2], [("resume", 1), ("pass", 2)], [1],
         ["base-00000", "delta-00001", "delta-00002"], 1,
         [("pass", 2), ("pass", 3), ("pass", 4)]),
        # killed inside pass 4's checkpoint save (shards written, no manifest), a fresh run
        ("mid_checkpoint", [0, 1, 2], [("pass", 0), ("pass", 1), ("pass", 2)], [1],
         ["base-00000", "delta-00001", "delta-00002", "delta-00003"], 1, [("pass", 2)]),
        # (the rerun of the one above) pass 4's checkpoint complete, its ledger line not
        # written: restored from the checkpoint, which also puts its record in the ledger
        ("checkpointed", [0, 1, 2], [("resume", 1), ("pass", 2)], [1, 3],
         ["base-00000", "delta-00001", "delta-00002", "delta-00003"], 3, [("pass", 4)]),
    ],
)  # fmt: skip
def test_crash_and_resume_equals_uninterrupted_run(
    stream, runs, reference, case, ledger, appended, checkpoints, inference, resume, rerun
):
    name, step = CASES[case]
    phase, seq, _ = CHAINS[name][step]
    crashes, last = runs[1][name]
    assert len(crashes) > step, "an earlier crash point of the chain was not reached"
    crashed, left = crashes[step]
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stdout[-3000:] + crashed.stderr[-3000:]

    # the model directory exactly as the crash left it: what the killed run appended (a
    # rerun: its resume record first), the effective ledger, the saves
    assert left["ledger"] == ledger
    assert left["appended"] == appended
    assert left["checkpoints"] == checkpoints
    assert left["inference"] == inference
    assert left["state"] == "running"

    # the next run of the chain (killed at the next point, or the last one) resumed from
    # the newest complete checkpoint and trained every pass after it exactly once more:
    # the records it appended (the ledger only grows)
    if step + 1 < len(crashes):
        assert crashes[step + 1][1] is not None, "the next run was not killed at its point"
        end = crashes[step + 1][1]["records"]
    else:
        _ok(last)
        end = None
    folder = stream / name
    model, book = ModelDir(folder), Ledger.of(folder)
    following = book.records()[left["records"] : end]
    restored = [("pass", resume)] if resume not in ledger else []  # the checkpoint's record
    assert [(r["kind"], r["seq"]) for r in following] == restored + [("resume", resume)] + rerun
    assert [(r["seq"], r["checkpoint"]) for r in following if r["kind"] == "resume"] == [
        (resume, str(model.checkpoint_path(model_pass(resume))))
    ]

    # the chain's end: the uninterrupted run's ledger, saves and model, bit for bit
    _ok(last)
    assert history(book.passes()) == history(Ledger.of(reference).passes())
    assert json.loads(model.status_path.read_text())["state"] == "completed"
    assert all((p / "MANIFEST.json").is_file() for p in model.checkpoints.iterdir())
    assert _inference(model) == _inference(ModelDir(reference))

    ref_arrays = checkpoint_arrays(reference / f"checkpoints/{FINAL}")
    arrays = checkpoint_arrays(folder / f"checkpoints/{FINAL}")
    assert sorted(arrays) == sorted(ref_arrays)
    for key, ref in ref_arrays.items():
        np.testing.assert_array_equal(arrays[key], ref, err_msg=key)
    print(f"\ncrash at {phase} of seq {seq}: resumed after seq {resume}; final checkpoints "
          f"equal ({len(arrays)} arrays, {arrays['deep_emb.shard-00000-of-00001.arrow:key'].size}"
          f" deep rows)")  # fmt: skip


def model_pass(seq: int):
    from sparseps.online.layout import PassId

    return PassId(seq, "20240101", seq)
