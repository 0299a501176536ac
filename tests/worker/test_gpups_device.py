"""GPUPS runs every step of a pass on its device (worker 0 of 1, one background server).

- the rows a step binds to the model are the device table's own tensors, and their
  gradient goes to the device rule without a pull or push to the servers;
- the dense model and its optimizer live on the device: the model's parameters are views
  of the device optimizer row, the servers' and the host's dense copies are not used
  per step; the predictions and dense parameters equal sync mode's within 1e-5;
- a checkpoint saves the device's dense row and a load gives it back to the device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.models import WideDeep

SLOTS = ("C1", "C2", "C3")

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


def _model(prefix: str) -> WideDeep:
    torch.manual_seed(0)
    return WideDeep(
        SLOTS, 2, emb_dim=4, hidden=(8,), deep_table=f"{prefix}_deep", wide_table=f"{prefix}_wide",
        deep_rule=sps.optim.Adagrad(lr=0.05), wide_rule=sps.optim.SGD(lr=0.05),
    )  # fmt: skip


def _dense(model) -> np.ndarray:
    return np.concatenate([p.detach().cpu().numpy().ravel() for p in model.head.parameters()])


@pytest.mark.parametrize("device", DEVICES)
def test_every_step_of_a_pass_runs_on_the_device(local_worker, planted, tmp_path, device):
    batches = planted(11, 6, 32, slots=SLOTS, vocab=60)
    sync_model = _model("s")
    sync = sps.Trainer(sync_model, sps.optim.Adam(lr=0.01), sps.Strategy(mode="sync"))
    model = _model("d")
    gpups = sps.Trainer(model, sps.optim.Adam(lr=0.01), sps.Strategy(mode=sps.GpuPS(device=device)))
    seen = []

    def inspect(step, stats):
        mode = gpups.state.mode
        emb = model.embeddings[0]
        values = mode.device_dense.values
        start = values.data_ptr()
        stop = start + values.numel() * values.element_size()
        seen.append(
            (
                emb.rows.device.type,  # the step's leaf lives on the device
                emb.rows.grad is not None and emb.rows.grad.device.type,
                all(start <= p.data_ptr() < stop for p in model.head.parameters()),
                next(model.head.parameters()).device.type,
            )
        )

    try:
        for _ in range(2):
            sync.train_from_dataset(batches, print_period=0)
            result = gpups.train_from_dataset(batches, print_period=0, on_batch=inspect)
        # one worker: no exchange; the rules' time is counted
        assert result.timings["rule_s"] > 0 and result.timings["exchange_s"] == 0
        assert seen and all(s == (device, device, True, device) for s in seen), seen[:2]
        mode = gpups.state.mode
        # the host dense table is not stepped: its values are the starting ones
        np.testing.assert_array_equal(
            mode.local_dense.pull(), _dense(_model("x"))[: mode.local_dense.size]
        )
        np.testing.assert_allclose(_dense(model), _dense(sync_model), rtol=1e-5, atol=1e-6)
        keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
        for table in ("deep", "wide"):
            np.testing.assert_allclose(
                gpups.client.pull(f"d_{table}", keys).wait(),
                sync.client.pull(f"s_{table}", keys).wait(), rtol=1e-5, atol=1e-6,
            )  # fmt: skip
        want = sync.infer_from_dataset(batches).predictions
        got = gpups.infer_from_dataset(batches).predictions
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # a checkpoint holds the device's dense row; a load gives it back to the device
        saved = _dense(model)
        gpups.save_checkpoint(tmp_path / "ckpt")
        gpups.train_from_dataset(batches, print_period=0)
        assert not np.array_equal(_dense(model), saved)
        gpups.load_checkpoint(tmp_path / "ckpt")
        np.testing.assert_array_equal(_dense(model), saved)
        np.testing.assert_array_equal(mode.device_dense.export()["values"], saved)
    finally:
        sync.stop()
        gpups.stop()
