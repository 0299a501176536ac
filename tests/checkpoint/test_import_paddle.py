"""``sparseps import-paddle`` (issue 54): a Paddle 2.6.2 PS save of CTR-accessor tables
(tests/fixtures/paddle_ctr) becomes a sparseps checkpoint whose rows and state equal
Paddle's saved values field by field, whose predictions equal Paddle's within 1e-4 (the
same AUC), and from which training goes on. Where the Paddle venv exists, a save Paddle
makes now is checked the same way."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import sparseps as sps
from sparseps.cli import main as cli_main
from sparseps.data.schema import Batch, Slot
from sparseps.files import shards
from sparseps.files.manifest import read_manifest
from sparseps.metrics import exact_auc
from sparseps.models.paddle_wide_deep import PaddleCtrSpec
from sparseps.worker.predict import read_predictions

pytestmark = pytest.mark.timeout(240)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "paddle_ctr"
PADDLE_VENV = Path(os.environ.get("PADDLE_VENV", "/tmp/paddle-2.6.2-venv"))
SLOTS = ("S0", "S1", "S2", "S3")
ARGS = ["--slots", ",".join(SLOTS), "--num-dense", "3", "--hidden", "8", "--embedx-dim", "4",
        "--embedx-threshold", "3", "--show-click-decay-rate", "0.98"]  # fmt: skip
SPEC = PaddleCtrSpec(slots=SLOTS, num_dense=3, hidden=(8,), embedx_dim=4,
                     ctr={"embedx_threshold": 3, "show_click_decay_rate": 0.98})  # fmt: skip


@pytest.fixture
def local_worker():
    """This process as worker 0 of 1 in local mode, with a fresh background server."""
    env = sps.init()
    assert env.local and env.worker_num == 1
    yield env
    sps.stop()


def _paddle_lines(save: Path, table: int) -> dict[int, list[float]]:
    """Paddle's text shards read the plainest way: key -> the floats of its line."""
    out = {}
    for path in sorted((save / "persistables" / f"{table:03d}").glob("part-*.gz")):
        with gzip.open(path, "rt") as f:
            text = f.read()
        for line in text.splitlines():
            if line.strip():
                key, *values = line.split()
                out[int(key)] = [float(v) for v in values]
    return out


def _checkpoint_rows(ckpt: Path, table: str) -> dict[str, np.ndarray]:
    manifest = read_manifest(ckpt)
    name = next(f for f in manifest["tables"][table]["files"] if ".shard-" in f)
    _, columns = shards.read_shard(ckpt / name)
    return columns


def _check_import(save: Path, ckpt: Path) -> None:
    assert cli_main(["import-paddle", str(save / "persistables"), "--out", str(ckpt), *ARGS]) == 0
    # rows and state, field by field
    deep, wide = _paddle_lines(save, 0), _paddle_lines(save, 1)
    columns = _checkpoint_rows(ckpt, "deep_emb")
    assert sorted(columns["key"].tolist()) == sorted(deep)
    short = sum(len(v) == 7 for v in deep.values())
    assert 0 < short < len(deep)  # lines with and without the embedx part
    for i, key in enumerate(columns["key"].tolist()):
        v = np.float32(deep[key])
        slot_, unseen, delta, show, click, embed_w, embed_g2sum = v[:7]
        assert (columns["unseen_days"][i], columns["delta_score"][i]) == (unseen, delta)
        assert (columns["show"][i], columns["click"][i]) == (show, click)
        assert columns["embedding"][i, 0] == embed_w and columns["state"][i, 0] == embed_g2sum
        if len(v) == 7:
            assert columns["has_embedx"][i] == 0 and not columns["embedding"][i, 1:].any()
            assert columns["state"][i, 1] == 0.0  # a fresh embedx state, as Paddle's load
        else:
            assert columns["has_embedx"][i] == 1
            np.testing.assert_array_equal(columns["embedding"][i, 1:], v[7:11])
            assert columns["state"][i, 1] == v[11]
    columns = _checkpoint_rows(ckpt, "wide_emb")
    by_key = {int(k): i for i, k in enumerate(columns["key"])}
    assert sorted(by_key) == sorted(wide)
    for key, v in wide.items():
        i = by_key[key]
        v = np.float32(v)
        assert columns["embedding"][i, 0] == v[5] and columns["state"][i, 0] == v[6]
        assert (columns["show"][i], columns["click"][i]) == (v[3], v[4])


def _predict_and_train(save: Path, ckpt: Path, tmp: Path) -> None:
    test = np.load(save / "test.npz")
    want = np.load(save / "predictions.npy")
    n = test["labels"].size
    offsets = np.arange(n + 1, dtype=np.int64)
    batch = Batch(
        label=test["labels"].astype(np.float32), dense=test["dense"].astype(np.float32),
        slots={s: Slot(np.ascontiguousarray(test["keys"][:, j]), offsets)
               for j, s in enumerate(SLOTS)},
    )  # fmt: skip
    trainer = sps.Trainer(SPEC.model(), sps.optim.Adam(lr=0.001), sps.Strategy(mode="sync"))
    try:
        trainer.load_checkpoint(ckpt)
        trainer.predict_from_dataset([batch], tmp / "pred")
        got = read_predictions(tmp / "pred").column("pred").to_numpy()
        np.testing.assert_allclose(got, want, atol=1e-4)
        assert exact_auc(got, batch.label) == pytest.approx(exact_auc(want, batch.label), abs=1e-6)
        before = trainer.client.pull("deep_emb", test["keys"][:8, 0].copy()).wait()
        trainer.train_from_dataset([batch, batch], print_period=0)  # training goes on
        after = trainer.client.pull("deep_emb", test["keys"][:8, 0].copy()).wait()
        assert np.isfinite(after).all() and not np.array_equal(after, before)
        assert (after[:, 0] > before[:, 0]).all() and (after[:, 1] >= before[:, 1]).all()
    finally:
        trainer.stop()


def test_import_the_kept_paddle_save(local_worker, tmp_path):
    save = FIXTURE / "save"
    _check_import(save, tmp_path / "ckpt")
    _predict_and_train(save, tmp_path / "ckpt", tmp_path)


@pytest.mark.skipif(not (PADDLE_VENV / "bin" / "fleetrun").exists(),
                    reason=f"no Paddle venv at {PADDLE_VENV} (see /work/shared/peers/paddle/run.sh)")  # fmt: skip
def test_import_a_save_paddle_makes_now(local_worker, tmp_path):
    out = tmp_path / "paddle_save"
    run = subprocess.run([str(FIXTURE / "make_fixture.sh"), str(out)], capture_output=True,
                         text=True, timeout=200, env={**os.environ, "PADDLE_VENV": str(PADDLE_VENV)})  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _check_import(out, tmp_path / "ckpt")
    _predict_and_train(out, tmp_path / "ckpt", tmp_path)
