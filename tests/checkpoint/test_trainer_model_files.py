"""Trainer-level model-file behaviour: clear load errors, tombstones across a restart,
interrupted inference saves, and the Predictor's fallback for keys not admitted.

Each job is ``tests/checkpoint/jobs/model_job.py`` run in local mode (one background
server, one worker), a few seconds each; a "restart" is a second job on the same files.
Four jobs serve the module's tests (see ``jobs``).
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
SHARD = "deep_emb.shard-00000-of-00001.arrow"  # the deep table's one shard


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


class Folders:
    """Where the module's jobs run and save (``jobs`` says what each holds)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.checkpoint = root / "saved" / "checkpoint"  # alone in its job's folder
        self.ckpt, self.infer = root / "ckpt", root / "infer"
        self.interrupted, self.not_admitted = root / "interrupted", root / "not_admitted"
        self.damaged = root / "damaged"


def _damage(checkpoint: Path, into: Path) -> None:
    """Copies of ``checkpoint`` in ``into``: ``no_manifest`` (its manifest removed) and
    ``flipped`` (one bit of a shard flipped)."""
    shutil.copytree(checkpoint, into / "no_manifest")
    (into / "no_manifest" / mf.MANIFEST).unlink()
    shutil.copytree(checkpoint, into / "flipped")
    shard = into / "flipped" / SHARD
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def jobs(data, tmp_path_factory):
    """The module's four jobs, two at a time (each mostly one busy process; a job's values
    depend on its steps only, not on timing). A job costs seconds of start-up, so each
    serves several tests, with its steps in an order that keeps each check's meaning (a
    load that fails changes nothing: the failing loads come first). Yields the folders
    and name -> future of the job's summary:

    - ``saved`` (shrink score 0.5): one pass, saved twice to ``checkpoint`` (deep table
      SGD dim 4, wide table Adagrad dim 1; the second save replaces the first), an
      inference base in ``infer``, a second pass, ``shrink``, a checkpoint in ``ckpt``;
    - ``interrupted``: a pass, a base in ``interrupted``, a pass, a delta interrupted
      after the servers wrote their rows, the next delta;
    - once ``saved`` is done, ``restart`` (learning rate 0.2): loads that must fail
      (``checkpoint`` without its manifest, with a shard altered, a folder never saved),
      then ``ckpt``, the next delta in ``infer``, one more pass; and ``not_admitted``
      (dim 8, rows admitted after 3 shows): a load of ``checkpoint`` that must fail (dim
      4), a pass, a base in ``not_admitted``, a pass, a delta.
    """
    at = Folders(tmp_path_factory.mktemp("jobs"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        saved = pool.submit(
            run_job, at.root / "saved", data,
            [f"save={at.checkpoint}", "train", f"save={at.checkpoint}", f"base={at.infer}",
             "train", "shrink", f"save={at.ckpt}"],
            "--shrink-score", "0.5",
        )  # fmt: skip
        interrupted = pool.submit(
            run_job, at.root / "interrupted_job", data,
            ["train", f"base={at.interrupted}", "train", f"delta-interrupted={at.interrupted}",
             f"delta={at.interrupted}"],
        )  # fmt: skip

        def restart() -> dict:
            saved.result()
            at.damaged.mkdir()
            _damage(at.checkpoint, at.damaged)
            steps = [f"load={at.damaged / 'no_manifest'}", f"load={at.damaged / 'flipped'}",
                     f"load={at.damaged / 'never_saved'}", f"load={at.ckpt}",
                     f"delta={at.infer}", "train"]  # fmt: skip
            return run_job(
                at.root / "restart_job", data, steps, "--lr", "0.2", "--shrink-score", "0.5"
            )

        def not_admitted() -> dict:
            saved.result()
            steps = [f"load={at.checkpoint}", "train", f"base={at.not_admitted}", "train",
                     f"delta={at.not_admitted}"]  # fmt: skip
            return run_job(at.root / "not_admitted_job", data, steps, "--emb-dim", "8",
                           "--admission", "count", "--admit-count", "3")  # fmt: skip

        # queued behind the first two: each waits for "saved" in the slot it takes
        yield at, {"saved": saved, "interrupted": interrupted,
                   "restart": pool.submit(restart), "not_admitted": pool.submit(not_admitted)}  # fmt: skip


def test_manifest_records_each_tables_layout(jobs):
    at, started = jobs
    started["saved"].result()
    tables = mf.read_manifest(at.checkpoint)["tables"]
    assert tables["deep_emb"]["layout"] == {
        "rule": "sgd",
        "dim": 4,
        "state_dim": 0,
        "state_columns": [],
        "stat_columns": ["show", "click", "delta_score", "unseen"],
    }
    assert tables["wide_emb"]["layout"]["state_columns"] == [["accumulator", 1]]
    # the second save over the first left no staging folder behind
    assert [p.name for p in at.checkpoint.parent.iterdir() if p.name.startswith(".")] == []


def test_clear_errors_for_missing_manifest_altered_shard_and_no_folder(jobs):
    at, started = jobs
    summary = started["restart"].result()
    missing, altered, absent = summary["load_errors"]  # and the load of ckpt had none
    no_manifest, shard = at.damaged / "no_manifest", at.damaged / "flipped" / SHARD
    assert str(no_manifest) in missing and "no MANIFEST.json" in missing
    assert str(shard) in altered and "checksum mismatch" in altered
    assert absent == f"{at.damaged / 'never_saved'}: no such model directory"


def test_resume_with_another_learning_rate_loads(jobs):
    """ckpt was saved after two passes at learning rate 0.05; the restart loads it at 0.2
    (after the failing loads) and trains on."""
    at, started = jobs
    summary = started["restart"].result()
    assert len(summary["load_errors"]) == 3  # the three failing loads only
    assert not any(str(at.ckpt) in error for error in summary["load_errors"])
    assert summary["load_state"]["passes"] == 2


def test_a_dim_change_names_the_table_expected_and_found(jobs):
    at, started = jobs
    summary = started["not_admitted"].result()
    [error] = summary["load_errors"]
    assert str(at.checkpoint) in error and "'deep_emb'" in error
    assert "expects dim=8, rule=sgd" in error and "holds dim=4, rule=sgd" in error
    assert "load_state" not in summary  # nothing loaded


def test_deletions_survive_a_restart_into_the_next_delta(jobs):
    at, started = jobs
    before, after = started["saved"].result(), started["restart"].result()
    deleted = before["deleted"]
    assert deleted["deep_emb"] > 100 and deleted["wide_emb"] > 100
    manifest = mf.read_manifest(at.ckpt)
    assert manifest["tables"]["deep_emb"]["tombstones"]["keys"] == deleted["deep_emb"]
    assert after["tombstones_after_load"] == deleted
    [delta] = after["predict"]
    assert delta["chain"] == ["base-00000", "delta-00001"]
    assert delta["tombstones"] == deleted
    assert delta["diff"] < 1e-6, delta
    predictor = Predictor(at.infer)
    for table in ("deep_emb", "wide_emb"):
        gone = ck.read_tombstones(at.ckpt / f"{table}.tombstones.arrow")
        assert gone.size == deleted[table]
        assert not np.isin(gone, predictor.tables[table].keys).any()


def test_an_interrupted_delta_leaves_its_rows_to_the_next_one(jobs):
    at, started = jobs
    summary, model = started["interrupted"].result(), at.interrupted
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


def test_predictor_gives_zeros_for_keys_not_admitted(jobs):
    summary = jobs[1]["not_admitted"].result()
    assert summary["pending"]["deep_emb"] > 100  # many keys were seen but not admitted
    base, delta = summary["predict"]
    assert delta["chain"] == ["base-00000", "delta-00001"]
    assert base["diff"] < 1e-6 and delta["diff"] < 1e-6, summary["predict"]
