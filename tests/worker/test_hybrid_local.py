"""Hybrid mode in one process (worker 0 of 1, one background server): the dense model
and its optimizer state live on the worker, and a checkpoint round trip restores them."""

from __future__ import annotations

import numpy as np
import torch

import sparseps as sps
from sparseps.files.dense_file import load_dense_file
from sparseps.files.manifest import read_manifest
from sparseps.models import WideDeep

SLOTS = ("C1", "C2", "C3")


def _dense(model) -> np.ndarray:
    return np.concatenate([p.detach().cpu().numpy().ravel() for p in model.head.parameters()])


def test_hybrid_dense_survives_a_checkpoint_and_trains(local_worker, planted, tmp_path):
    batches = planted(5, 8, 32, slots=SLOTS, vocab=40)
    torch.manual_seed(0)
    model = WideDeep(SLOTS, 2, emb_dim=4, hidden=(8,), deep_table="h_deep", wide_table="h_wide")
    start = _dense(model)
    trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode="hybrid"))
    try:
        result = trainer.train_from_dataset(batches, print_period=0)
        assert result.samples == 8 * 32 and result.batches == 8
        assert "push_s" in result.timings
        saved = _dense(model)
        assert np.abs(saved - start).max() > 1e-3  # the dense rule ran on the worker
        manifest = trainer.save_checkpoint(tmp_path / "ckpt")
        arrays = load_dense_file(tmp_path / "ckpt" / manifest["dense"]["file"])
        np.testing.assert_array_equal(arrays["values"], saved)
        assert np.abs(arrays["state"]).max() > 0  # Adam's moments, saved from the worker
        assert read_manifest(tmp_path / "ckpt")["state"]["mode"] == "hybrid"
        trainer.train_from_dataset(batches, print_period=0)  # move away from it
        assert not np.array_equal(_dense(model), saved)
        trainer.load_checkpoint(tmp_path / "ckpt")
        np.testing.assert_array_equal(_dense(model), saved)
        restored = trainer.state.mode.local_dense.export()  # the optimizer state too
        np.testing.assert_array_equal(restored["state"], arrays["state"])
        assert trainer.evaluate(batches).count == 8 * 32
    finally:
        trainer.stop()
