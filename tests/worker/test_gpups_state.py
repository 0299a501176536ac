"""GPUPS and the servers' optimizer state, and the next pass prepared during this one.

- the write-back writes whole rows (``write_rows``): a checkpoint saved after GPUPS
  passes holds the optimizer state columns a sync run holds (to 1e-6), and the
  servers hold exactly the device table's final rows (no ``pulled + (final - pulled)``:
  the prepared-pass test's carried rows equal the rows pulled back, bit for bit);
- a new job that loads that checkpoint and trains a GPUPS pass equals a sync pass
  continuing from the same checkpoint (the state comes from the servers, not from a
  worker's memory of earlier passes);
- a pass prepared during the previous one (``Trainer.prefetch_pass``) builds the same
  rows as a pass built at its start, from carried-over and early-pulled rows, and the
  stall between the passes (write-back + build) is measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.files.shards import read_shard
from sparseps.models import WideDeep
from sparseps.worker.gpups_build import Carry, pick_rows

SLOTS = ("C1", "C2", "C3")

pytestmark = pytest.mark.timeout(300)


def _model(prefix: str, lifecycle: sps.Lifecycle | None = None) -> WideDeep:
    torch.manual_seed(0)
    return WideDeep(
        SLOTS, 2, emb_dim=4, hidden=(8,), deep_table=f"{prefix}_deep", wide_table=f"{prefix}_wide",
        deep_rule=sps.optim.Adam(lr=0.05, eps=1e-4),
        wide_rule=sps.optim.FTRL(alpha=0.1, beta=1.0, l1=0.01, l2=0.01), lifecycle=lifecycle,
    )  # fmt: skip


def _trainer(prefix: str, mode: str, lifecycle: sps.Lifecycle | None = None) -> sps.Trainer:
    strategy = sps.Strategy(mode=sps.GpuPS(device="cpu") if mode == "gpups" else mode)
    return sps.Trainer(_model(prefix, lifecycle), sps.optim.Adam(lr=0.01), strategy)


def _keys(batches) -> np.ndarray:
    return np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))


def _saved_rows(directory: Path, table: str) -> dict[str, np.ndarray]:
    """A checkpoint's rows of ``table``, sorted by key: ``{"key", "embedding", "state"}``."""
    parts = [read_shard(p)[1] for p in sorted(directory.rglob(f"{table}.shard-*.arrow"))]
    assert parts, f"no shard file of {table} under {directory}"
    columns = {n: np.concatenate([p[n] for p in parts]) for n in ("key", "embedding", "state")}
    order = np.argsort(columns["key"])
    return {n: v[order] for n, v in columns.items()}


def _dense(model) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in model.head.parameters()])


def test_gpups_checkpoints_hold_sync_optimizer_state_and_a_new_job_continues_like_sync(
    local_worker, planted, tmp_path
):
    batches = planted(5, 8, 32, slots=SLOTS, vocab=40)
    more = planted(6, 4, 32, slots=SLOTS, vocab=60)  # the next pass: new keys too
    keys = _keys(batches + more)
    sync, gpups = _trainer("s", "sync"), _trainer("g", "gpups")
    try:
        for trainer in (sync, gpups):
            for _ in range(2):
                trainer.train_from_dataset(batches, print_period=0)
            trainer.save_checkpoint(tmp_path / trainer.strategy.mode_name)
        for table in ("deep", "wide"):
            want = _saved_rows(tmp_path / "sync", f"s_{table}")
            got = _saved_rows(tmp_path / "gpups", f"g_{table}")
            np.testing.assert_array_equal(got["key"], want["key"])
            assert np.abs(want["state"]).max() > 1e-2  # the state moved (10^4 x the tolerance)
            np.testing.assert_allclose(got["state"], want["state"], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got["embedding"], want["embedding"], rtol=1e-6, atol=1e-6)
    finally:
        sync.stop()
        gpups.stop()

    def continue_from_checkpoint(mode: str):
        trainer = _trainer("g", mode)  # the checkpoint's table names, a fresh trainer
        try:
            trainer.load_checkpoint(tmp_path / "gpups")
            trainer.train_from_dataset(more, print_period=0)
            full = {t: trainer.client.pull_full(t, keys).wait() for t in ("g_deep", "g_wide")}
            return full, _dense(trainer.model)
        finally:
            trainer.stop()

    gpups_rows, gpups_dense = continue_from_checkpoint("gpups")
    sync_rows, sync_dense = continue_from_checkpoint("sync")
    for table, want in sync_rows.items():
        np.testing.assert_allclose(gpups_rows[table], want, rtol=1e-6, atol=1e-6, err_msg=table)
    np.testing.assert_allclose(gpups_dense, sync_dense, rtol=1e-5, atol=1e-6)


def test_a_pass_prepared_during_the_previous_one_builds_the_same_rows(local_worker, planted):
    first = planted(7, 6, 32, slots=SLOTS, vocab=50)
    second = planted(8, 6, 32, slots=SLOTS, vocab=80)  # shares keys with the first, and new
    keys = _keys(first + second)
    runs = {}
    for prefix, overlap in (("p", None), ("o", "before"), ("d", "during")):
        trainer = _trainer(prefix, "gpups")

        def during(step, stats, trainer=trainer, asked=[]):  # noqa: B006 - once per trainer
            if not asked:
                asked.append(trainer.prefetch_pass(second))  # in the pass: for the next one

        try:
            if overlap == "before":
                trainer.prefetch_pass(second)  # between passes: for the pass after the next
            on_batch = during if overlap == "during" else None
            passes = [trainer.train_from_dataset(first, print_period=0, on_batch=on_batch)]
            mode = trainer.state.mode
            built = {}
            original = type(mode).begin_pass

            def spy(dataset, lookups, index, mode=mode, built=built, original=original):
                original(mode, dataset, lookups, index)
                built.update({n[2:]: s.result()["rows"].copy() for n, s in mode.shards.items()})
                built["keys"] = {n[2:]: s.keys.copy() for n, s in mode.shards.items()}

            mode.begin_pass = spy
            passes.append(trainer.train_from_dataset(second, print_period=0))
            rows = {t[2:]: trainer.client.pull_full(t, keys).wait() for t in trainer.tables}
            runs[overlap] = (built, mode.last_build, rows, passes)
        finally:
            trainer.stop()
    plain = runs[None]
    shared = np.intersect1d(_keys(first), _keys(second)).size
    for overlapped in (runs["before"], runs["during"]):
        for table in ("deep", "wide"):
            np.testing.assert_array_equal(overlapped[0]["keys"][table], plain[0]["keys"][table])
            # the build of pass 2: carried + early rows equal pulled ones, bit for bit
            np.testing.assert_array_equal(overlapped[0][table], plain[0][table])
            # and so the trained rows, embedding and optimizer state
            np.testing.assert_array_equal(overlapped[2][table], plain[2][table])
        build = overlapped[1]
        assert build["carried"] == 2 * shared  # two tables
        assert build["early"] == 2 * (_keys(second).size - shared) and build["pulled"] == 0
        assert overlapped[3][1].timings["next_pass_s"] > 0
    assert plain[1]["carried"] == plain[1]["early"] == 0
    assert plain[1]["pulled"] == 2 * _keys(second).size
    for run in runs.values():  # the stall is measured: write-back and build
        assert run[3][1].timings["build_s"] > 0 and run[3][0].timings["write_back_s"] > 0


def test_carried_rows_come_before_early_ones_and_missing_ones_are_pulled():
    keys = np.array([1, 2, 3, 4], np.uint64)
    carry = Carry(np.array([2, 3], np.uint64), np.array([[20.0], [30.0]], np.float32))
    has = np.array([False, False, True, True])  # 3 is carried too: the carried row wins
    early = np.array([[0.0], [0.0], [-3.0], [40.0]], np.float32)
    rows, need, counts = pick_rows(keys, carry, has, early, 1)
    assert need.tolist() == [0]
    assert rows[1:, 0].tolist() == [20.0, 30.0, 40.0]
    assert counts == {"carried": 2, "early": 1}


def test_a_shrink_between_the_passes_drops_the_prepared_rows(local_worker, planted):
    """Rows pulled early for the next pass, deleted by a shrink before it: the build must
    not use them (the servers' row count tells), and so equals a build without them."""
    zero = planted(9, 4, 32, slots=SLOTS, vocab=60)
    first = planted(10, 4, 32, slots=SLOTS, vocab=30)
    second = planted(11, 4, 32, slots=SLOTS, vocab=60)
    keys = _keys(zero + first + second)
    lifecycle = sps.Lifecycle(shrink_unseen_days=0)  # a shrink deletes rows unseen for a day
    runs = {}
    for prefix, overlap in (("x", False), ("y", True)):
        trainer = _trainer(prefix, "gpups", lifecycle)
        try:
            trainer.train_from_dataset(zero, print_period=0)
            trainer.decay()
            if overlap:
                trainer.prefetch_pass(second)  # its early pull runs during `first`
            trainer.train_from_dataset(first, print_period=0)
            trainer.decay()  # the keys of `zero` not in `first` are unseen for a day ...
            assert sum(trainer.shrink().values()) > 0  # ... and deleted
            trainer.train_from_dataset(second, print_period=0)
            rows = {t[2:]: trainer.client.pull_full(t, keys).wait() for t in trainer.tables}
            runs[overlap] = (rows, dict(trainer.state.mode.last_build))
        finally:
            trainer.stop()
    for table in ("deep", "wide"):
        np.testing.assert_array_equal(runs[True][0][table], runs[False][0][table])
    assert runs[True][1]["carried"] == runs[True][1]["early"] == 0  # dropped: all pulled
