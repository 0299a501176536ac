"""GPUPS mode in one process (worker 0 of 1, one background server), device="cpu".

- two GPUPS passes equal two sync passes on the same data and seed (rows, dense
  parameters and show/click counts), for Adam (deep table) and FTRL (wide table);
- after GPUPS passes the servers hold the model: a checkpoint saved and loaded back
  gives the same pulls;
- a QueueDataset and an unknown device are refused, with errors that name what and how
  to fix; a pass over the memory budget is split; the rows of a pass that fails are dropped.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.errors import ConfigError
from sparseps.models import WideDeep
from sparseps.worker.gpups_table import bytes_per_key

SLOTS = ("C1", "C2", "C3")


def _model(prefix: str) -> WideDeep:
    torch.manual_seed(0)
    return WideDeep(
        SLOTS, 2, emb_dim=4, hidden=(8,), deep_table=f"{prefix}_deep", wide_table=f"{prefix}_wide",
        deep_rule=sps.optim.Adam(lr=0.05, eps=1e-4),
        wide_rule=sps.optim.FTRL(alpha=0.1, beta=1.0, l1=0.01, l2=0.01),
    )  # fmt: skip


def _train(prefix: str, strategy: sps.Strategy, batches, passes: int = 2):
    model = _model(prefix)
    trainer = sps.Trainer(model, sps.optim.Adam(lr=0.01), strategy)
    for _ in range(passes):
        result = trainer.train_from_dataset(batches, print_period=0)
    return trainer, model, result


def _dense(model) -> np.ndarray:
    return np.concatenate([p.detach().cpu().numpy().ravel() for p in model.head.parameters()])


# the CUDA path runs where a GPU is visible (CI has none; bench/RESULTS.md names the GPU
# of the last run there)
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_gpups_passes_equal_sync_passes_and_survive_a_checkpoint(
    local_worker, planted, tmp_path, device
):
    batches = planted(5, 8, 32, slots=SLOTS, vocab=40)
    keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
    sync, sync_model, _ = _train("s", sps.Strategy(mode="sync"), batches)
    gpups, gpups_model, result = _train("g", sps.Strategy(mode=sps.GpuPS(device=device)), batches)
    try:
        assert result.timings["build_s"] > 0 and result.samples == 8 * 32
        assert gpups._mode.last_build["keys"] == {"g_deep": keys.size, "g_wide": keys.size}
        stats = {t: s for t, s in sync.client.stats()["total"]["tables"].items()}
        for table in ("deep", "wide"):
            want = sync.client.pull(f"s_{table}", keys).wait()
            got = gpups.client.pull(f"g_{table}", keys).wait()
            # The device rules equal the server's but for a rare last float64 bit (pow,
            # sqrt of another math library); the write-back writes the final rows whole.
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            assert np.abs(want).max() > 1e-2  # the rows moved (10^4 x the tolerance)
            assert stats[f"g_{table}"]["rows"] == stats[f"s_{table}"]["rows"] == keys.size
        np.testing.assert_allclose(_dense(gpups_model), _dense(sync_model), rtol=1e-5, atol=1e-6)
        # the servers hold the model: a checkpoint round trip gives the same pulls
        before = {t: gpups.client.pull(t, keys).wait() for t in gpups.tables}
        gpups.save_checkpoint(tmp_path / "ckpt")
        gpups.train_from_dataset(batches, print_period=0)  # move away from the checkpoint
        moved = gpups.client.pull("g_deep", keys).wait()
        assert not np.array_equal(moved, before["g_deep"])
        gpups.load_checkpoint(tmp_path / "ckpt")
        for table, rows in before.items():
            np.testing.assert_array_equal(gpups.client.pull(table, keys).wait(), rows)
        assert gpups.evaluate(batches).count == 8 * 32  # pulls from the servers after a pass
    finally:
        sync.stop()
        gpups.stop()


def test_gpups_refuses_a_stream_and_splits_a_pass_over_its_memory_budget(
    local_worker, planted, tmp_path
):
    batches = planted(6, 2, 16, slots=SLOTS, vocab=20)
    (tmp_path / "part.tsv").write_text("0\t" + "\t" * 38 + "\n")
    stream = QueueDataset([str(tmp_path / "part.tsv")], CRITEO, batch_size=4, threads=1)
    trainer = sps.Trainer(_model("q"), strategy=sps.Strategy(mode=sps.GpuPS(device="cpu")))
    try:
        with pytest.raises(ConfigError, match="InMemoryDataset.*QueueDataset.*known before"):
            trainer.train_from_dataset(stream, print_period=0)
    finally:
        trainer.stop()
    if not torch.cuda.is_available():  # the trainer's first use names the missing GPU
        trainer = sps.Trainer(_model("c"), strategy=sps.Strategy(mode=sps.GpuPS(device="cuda")))
        try:
            with pytest.raises(ConfigError, match="device='cuda': no CUDA device is visible"):
                trainer.train_from_dataset(batches, print_period=0)
        finally:
            trainer.stop()
    model = _model("b")
    keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
    need = sum(keys.size * bytes_per_key(e.config) for e in model.embeddings)
    strategy = sps.Strategy(mode=sps.GpuPS(device="cpu", memory_bytes=need - 1))
    trainer = sps.Trainer(model, strategy=strategy)
    try:  # a byte over the budget: split into sub-passes, not refused
        result = trainer.train_from_dataset(batches, print_period=0)
        assert result.samples == 32 and result.timings["sub_passes"] == 2
    finally:
        trainer.stop()
    trainer = sps.Trainer(
        _model("b"), strategy=sps.Strategy(mode=sps.GpuPS(device="cpu", memory_bytes=need))
    )
    try:  # exactly the budget fits
        assert trainer.train_from_dataset(batches, print_period=0).samples == 32
        before = trainer.client.pull("b_deep", keys).wait()

        def fail(step, stats):
            raise RuntimeError("a batch failed")

        with pytest.raises(RuntimeError, match="a batch failed"):
            trainer.train_from_dataset(batches, print_period=0, on_batch=fail)
        # the failed pass's rows are dropped, not written back; pulls read the servers again
        assert trainer.state.mode.shards is None
        assert trainer.evaluate(batches).count == 32
        np.testing.assert_array_equal(trainer.client.pull("b_deep", keys).wait(), before)
        assert trainer.train_from_dataset(batches, print_period=0).samples == 32
    finally:
        trainer.stop()


def test_gpups_validates_device_and_budget():
    with pytest.raises(ConfigError, match=r"GpuPS.device: expected one of .*'cuda'.*got 'tpu'"):
        sps.GpuPS(device="tpu")
    with pytest.raises(ConfigError, match="GpuPS.memory_bytes"):
        sps.GpuPS(memory_bytes=0)
    assert sps.Strategy(mode="gpups").mode == sps.GpuPS()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_device_cuda_without_a_gpu_fails_clearly():
    from sparseps.worker.gpups import resolve_device

    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="device='cuda': no CUDA device is visible to worker 3"):
        resolve_device("cuda", rank=3)


def test_pass_keys_are_the_lookups_keys_with_or_without_compaction(planted):
    from sparseps.worker.binding import TableBinder
    from sparseps.worker.gpups import _pass_keys

    batches = planted(9, 6, 16, slots=SLOTS, vocab=50)
    model = _model("k")
    binder = TableBinder(list(model.embeddings))
    tables = sorted(binder.tables)
    want = np.unique(np.concatenate([binder.lookups(b)["k_deep"].keys for b in batches]))
    for compact in (1 << 24, 10):  # 10 ids: a compaction after every batch
        keys, shared = _pass_keys(batches, binder.lookups, tables, compact_ids=compact)
        assert shared.tolist() == [0, 0]  # the two tables share one dedup
        for name in tables:
            np.testing.assert_array_equal(keys[name], want)
    keys, shared = _pass_keys([], binder.lookups, tables)
    assert shared.tolist() == [-1, -1] and all(k.size == 0 for k in keys.values())
