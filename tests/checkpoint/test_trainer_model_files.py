"""Trainer-level model-file behaviour: clear load errors, tombstones across a restart,
interrupted inference saves, and the Predictor's fallback for keys not admitted.

Each job is ``tests/checkpoint/jobs/model_job.py`` run in local mode (one background
server, one worker), a few seconds each; a "restart" is a second job on the same files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from sparseps.checkpoint import checkpoint as ck
from sparseps.checkpoint.predictor import Predictor
from sparseps.data.synthetic import write_dataset
from sparseps.files import manifest as mf
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "checkpoint" / "jobs" / "model_job.py"


def run_job(work: Path, data: Path, steps: list[str], *options: str) -> dict:
    """Run the job in local mode; returns worker 0's summary."""
    work.mkdir(parents=True, exist_ok=True)
    env = clean_environ()
    out = work / "summary.json"
    done = subprocess.run(
        [
            sys.executable,
            str(JOB),
            "--train",
            str(data / "train"),
            "--test",
            str(data / "test"),
            "--out",
            str(out),
            "--steps",
            ",".join(steps),
            *options,
        ],  # fmt: skip
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_dataset(folder, rows=600, seed=3, files=2, test_rows=300)
    return folder


def _deletions(data: Path, root: Path) -> tuple[dict, dict]:
    """Train, save a base, train, shrink, checkpoint; then a "restart" loads the checkpoint
    and saves the next delta. Returns both jobs' summaries."""
    ckpt, model = root / "ckpt", root / "infer"
    before = run_job(
        root / "a",
        data,
        ["train", f"base={model}", "train", "shrink", f"save={ckpt}"],
        "--shrink-score", "0.5",
    )  # fmt: skip
    after = run_job(root / "b", data, [f"load={ckpt}", f"delta={model}"], "--shrink-score", "0.5")
    return before, after


def _interrupted(data: Path, root: Path) -> dict:
    model = root / "infer"
    steps = ["train", f"base={model}", "train", f"delta-interrupted={model}", f"delta={model}"]
    return run_job(root, data, steps)


def _not_admitted(data: Path, root: Path) -> dict:
    model = root / "infer"
    steps = ["train", f"base={model}", "train", f"delta={model}"]
    return run_job(root, data, steps, "--admission", "count", "--admit-count", "3")


@pytest.fixture(scope="module")
def background(data, tmp_path_factory):
    """The jobs that need nothing from a test, one after another in a thread while the
    tests of the saved checkpoint run theirs: two jobs at a time, each mostly one busy
    process (the job's values depend on its steps only, not on timing). Eight jobs one
    after another were most of this module's time. Maps name -> (future, folder)."""
    started = {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        for name, job in (("deletions", _deletions), ("interrupted", _interrupted),
                          ("not_admitted", _not_admitted)):  # fmt: skip
            root = tmp_path_factory.mktemp(name)
            started[name] = (pool.submit(job, data, root), root)
        yield started


@pytest.fixture(scope="module")
def checkpoint(data, background, tmp_path_factory):
    """One pass of training, saved (deep table SGD dim 4, wide table Adagrad dim 1)."""
    work = tmp_path_factory.mktemp("saved")
    run_job(work, data, [f"save={work / 'ckpt'}", "train", f"save={work / 'ckpt'}"])
    return work / "ckpt"


def test_manifest_records_each_tables_layout(checkpoint):
    tables = mf.read_manifest(checkpoint)["tables"]
    assert tables["deep_emb"]["layout"] == {
        "rule": "sgd",
        "dim": 4,
        "state_dim": 0,
        "state_columns": [],
        "stat_columns": ["show", "click", "delta_score", "unseen"],
    }
    assert tables["wide_emb"]["layout"]["state_columns"] == [["accumulator", 1]]
    assert [p.name for p in checkpoint.parent.iterdir() if p.name.startswith(".")] == []


def test_resume_with_another_learning_rate_loads(checkpoint, data, tmp_path):
    summary = run_job(tmp_path, data, [f"load={checkpoint}", "train"], "--lr", "0.2")
    assert summary["load_errors"] == []
    assert summary["load_state"]["passes"] == 1


def test_a_dim_change_names_the_table_expected_and_found(checkpoint, data, tmp_path):
    summary = run_job(tmp_path, data, [f"load={checkpoint}"], "--emb-dim", "8")
    [error] = summary["load_errors"]
    assert str(checkpoint) in error and "'deep_emb'" in error
    assert "expects dim=8, rule=sgd" in error and "holds dim=4, rule=sgd" in error


def test_clear_errors_for_missing_manifest_altered_shard_and_no_folder(checkpoint, data, tmp_path):
    no_manifest = tmp_path / "no_manifest"
    shutil.copytree(checkpoint, no_manifest)
    (no_manifest / mf.MANIFEST).unlink()
    flipped = tmp_path / "flipped"
    shutil.copytree(checkpoint, flipped)
    shard = flipped / "deep_emb.shard-00000-of-00001.arrow"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    steps = [f"load={no_manifest}", f"load={flipped}", f"load={tmp_path / 'never_saved'}"]
    summary = run_job(tmp_path / "job", data, steps)
    missing, altered, absent = summary["load_errors"]
    assert str(no_manifest) in missing and "no MANIFEST.json" in missing
    assert str(shard) in altered and "checksum mismatch" in altered
    assert absent == f"{tmp_path / 'never_saved'}: no such model directory"
    assert "load_state" not in summary  # none of them loaded


def test_deletions_survive_a_restart_into_the_next_delta(background):
    future, root = background["deletions"]
    before, after = future.result()
    ckpt, model = root / "ckpt", root / "infer"
    deleted = before["deleted"]
    assert deleted["deep_emb"] > 100 and deleted["wide_emb"] > 100
    assert mf.read_manifest(ckpt)["tables"]["deep_emb"]["tombstones"]["keys"] == deleted["deep_emb"]
    assert after["tombstones_after_load"] == deleted
    [delta] = after["predict"]
    assert delta["chain"] == ["base-00000", "delta-00001"]
    assert delta["tombstones"] == deleted
    assert delta["diff"] < 1e-6, delta
    predictor = Predictor(model)
    for table in ("deep_emb", "wide_emb"):
        gone = ck.read_tombstones(ckpt / f"{table}.tombstones.arrow")
        assert gone.size == deleted[table]
        assert not np.isin(gone, predictor.tables[table].keys).any()


def test_an_interrupted_delta_leaves_its_rows_to_the_next_one(background):
    future, root = background["interrupted"]
    summary, model = future.result(), root / "infer"
    assert len(summary["interrupted"]) == 1 and "injected crash" in summary["interrupted"][0]
    base, delta = summary["predict"]
    # the second pass touched every row again: the delta must hold all of them, although
    # the interrupted save had already exported them
    assert delta["folder"] == "delta-00001"
    assert delta["rows"] == base["rows"] and base["rows"]["deep_emb"] > 1000
    assert delta["chain"] == ["base-00000", "delta-00001"]
    assert delta["diff"] < 1e-6, delta
    # the interrupted save's staging folder was removed by the next save: no leftovers
    assert sorted(p.name for p in model.iterdir()) == ["base-00000", "delta-00001"]


def test_predictor_gives_zeros_for_keys_not_admitted(background):
    summary = background["not_admitted"][0].result()
    assert summary["pending"]["deep_emb"] > 100  # many keys were seen but not admitted
    base, delta = summary["predict"]
    assert delta["chain"] == ["base-00000", "delta-00001"]
    assert base["diff"] < 1e-6 and delta["diff"] < 1e-6, summary["predict"]
