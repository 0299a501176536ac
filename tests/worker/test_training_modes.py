"""Training modes end to end: real launcher, servers and workers on loopback.

- sync mode equals a plain one-process PyTorch reference on the global batch;
- infer leaves every table unchanged;
- async and geo converge to about the sync result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseps.data import CRITEO, QueueDataset
from sparseps.data.synthetic import write_dataset
from sparseps.observe.diagnose import AUTO_TIMEOUT_S
from sparseps.table.initializers import initial_values
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "train_job.py"


def _env() -> dict:
    return clean_environ()


def launch(
    tmp: Path,
    *job_args: str,
    servers: int = 2,
    workers: int = 2,
    timeout: float = 240,
    launcher: tuple[str, ...] = (),
) -> dict:
    out = tmp / "out.npz"
    cmd = [
        sys.executable, "-m", "sparseps.cli", "launch", "--server-num", str(servers),
        "--worker-num", str(workers), "--log-dir", str(tmp / "log"), *launcher, str(JOB),
        "--out", str(out), *job_args,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with np.load(out) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["summary"] = json.loads(Path(str(out) + ".json").read_text())
    return arrays


def _batches(train_dir: Path, rank: int, world: int, batch_size: int) -> list:
    return list(
        QueueDataset(
            [str(train_dir)], CRITEO, batch_size=batch_size, threads=1, rank=rank, world=world
        )
    )


def _all_keys(batches) -> np.ndarray:
    return np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))


def _reference(train_dir: Path, keys: np.ndarray, batch_size: int, passes: int = 1):
    """One process, full embedding tables, the global batch of both workers per step."""
    from sparseps.models import WideDeep
    from sparseps.optim import SGD, Adagrad

    torch.manual_seed(0)
    model = WideDeep(
        CRITEO.slots,
        len(CRITEO.dense),
        emb_dim=4,
        hidden=(16,),
        deep_rule=SGD(lr=0.05),
        wide_rule=Adagrad(lr=0.05),
    )
    head = model.head
    deep_cfg, wide_cfg = (e.config for e in model.embeddings)
    deep = torch.nn.Parameter(
        torch.from_numpy(initial_values(keys, 4, deep_cfg.initializer, deep_cfg.seed))
    )
    wide = torch.nn.Parameter(
        torch.from_numpy(initial_values(keys, 1, wide_cfg.initializer, wide_cfg.seed))
    )
    opt_deep = torch.optim.SGD([deep], lr=0.05)
    opt_wide = torch.optim.Adagrad([wide], lr=0.05, eps=1e-10)
    opt_head = torch.optim.Adam(head.parameters(), lr=0.01)
    shards = [_batches(train_dir, r, 2, batch_size) for r in range(2)]
    position = {int(k): i for i, k in enumerate(keys)}
    for _ in range(passes):
        for step in range(max(len(s) for s in shards)):
            parts = [s[step] for s in shards if step < len(s)]
            labels = torch.from_numpy(np.concatenate([b.label for b in parts]))
            dense = torch.from_numpy(np.concatenate([b.dense for b in parts]))
            # per (sample, slot) bags, built the slow obvious way
            index, offsets = [], []
            for name in CRITEO.slots:
                for b in parts:
                    slot = b.slots[name]
                    for i in range(len(b)):
                        offsets.append(len(index))
                        index.extend(
                            position[int(k)]
                            for k in slot.values[slot.offsets[i] : slot.offsets[i + 1]]
                        )
            idx, off = (
                torch.tensor(index, dtype=torch.int64),
                torch.tensor(offsets, dtype=torch.int64),
            )
            total = len(labels)
            pooled = [
                F.embedding_bag(idx, w, off, mode="sum")
                .view(len(CRITEO.slots), total, -1)
                .transpose(0, 1)
                for w in (deep, wide)
            ]
            logits = head(dense, *pooled).reshape(-1)
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            for o in (opt_deep, opt_wide, opt_head):
                o.zero_grad()
            loss.backward()
            for o in (opt_deep, opt_wide, opt_head):
                o.step()
    dense_vec = torch.nn.utils.parameters_to_vector(head.parameters()).detach().numpy()
    return deep.detach().numpy(), wide.detach().numpy(), dense_vec


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_dataset(folder, rows=200, seed=7, files=2, test_rows=200)
    batches = _batches(folder / "train", 0, 1, 16)
    keys = _all_keys(batches)
    np.save(folder / "keys.npy", keys)
    return folder, keys


def test_sync_mode_equals_one_process_on_the_global_batch(small_data, tmp_path):
    folder, keys = small_data
    got = launch(
        tmp_path,
        "--train",
        str(folder / "train"),
        "--keys",
        str(folder / "keys.npy"),
        "--mode",
        "sync",
        "--passes",
        "2",
    )
    deep, wide, dense = _reference(folder / "train", keys, 16, passes=2)
    # float32 sums in a different order (per worker, then across workers): 1e-5 absolute
    np.testing.assert_allclose(got["table.deep_emb"], deep, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got["table.wide_emb"], wide, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got["dense"], dense, atol=1e-5, rtol=0)
    # and training moved the rows (the comparison is not between two untouched tables)
    assert np.abs(deep - initial_values(keys, 4, _deep_init(), 0)).max() > 1e-3


def _deep_init():
    from sparseps.config import Initializer

    return Initializer.uniform(-0.05, 0.05)


def test_infer_leaves_every_table_unchanged(small_data, tmp_path):
    folder, _ = small_data
    got = launch(
        tmp_path, "--train", str(folder / "train"), "--test", str(folder / "test"), "--keys",
        str(folder / "keys.npy"), "--mode", "async", "--infer-check",
        "--metrics-path", str(tmp_path / "metrics.jsonl"), "--dump", str(tmp_path / "dump"), servers=1,
    )  # fmt: skip
    summary = got["summary"]
    # every worker compared every saved column (and the shard files' sha256) and the
    # server dense table before and after inference
    assert summary["infer_unchanged"] == [True, True], summary
    assert summary["dense_checked"] is True
    for files, values in summary["infer_checked"]:
        assert files == 4 and values > 1000  # 2 tables x (rows + pending) on 1 server
    assert summary["change_detected"] is True  # one more show on one key is caught
    # the per-pass JSON lines (train then test) and the dumps of both workers
    from sparseps.metrics import read_dump, read_jsonl

    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["pass"], r["phase"]) for r in lines] == [(0, "train"), (0, "test")]
    assert lines[1]["auc"] == pytest.approx(got["summary"]["test_auc"])
    fields = [
        read_dump(p) for p in sorted((tmp_path / "dump").glob("pass-00000/fields-worker-*.parquet"))
    ]
    assert len(fields) == 2 and sum(len(f["label"]) for f in fields) == 200
    assert all(((f["pred"] > 0) & (f["pred"] < 1)).all() for f in fields)
    assert got["summary"]["stats_unchanged"] is True, got["summary"]["stats"]


@pytest.fixture(scope="module")
def planted_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("planted")
    meta = write_dataset(folder, rows=30000, seed=11, files=4, test_rows=6000)
    np.save(folder / "keys.npy", np.zeros(1, np.uint64))
    return folder, meta


@pytest.fixture(scope="module", autouse=True)
def sync_job(planted_data, tmp_path_factory):
    """The sync run of the planted data (sync_auc's), started with the module in a thread:
    it runs beside the jobs of the first two tests (sync mode: its AUC is the same on
    every run, whatever runs beside it), and is done before the async and geo runs, whose
    AUC spread was measured with nothing beside them, start (they wait for sync_auc)."""
    folder, _ = planted_data
    tmp = tmp_path_factory.mktemp("sync")
    args = [
        "--train",
        str(folder / "train"),
        "--test",
        str(folder / "test"),
        "--keys",
        str(folder / "keys.npy"),
    ]
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(launch, tmp, *args, "--mode", "sync", "--batch-size", "64", servers=1)


@pytest.fixture(scope="module")
def sync_auc(sync_job):
    return sync_job.result()["summary"]["test_auc"]


# How far async and geo may land from sync's test AUC on this job. Sync mode is
# deterministic (0.7678 on every run: the servers apply the sum of both workers' gradients
# once per step). Async and geo are not: which worker's update reaches the server first,
# and which rows a pull sees, depend on thread and process timing, so their AUC is a draw.
# Measured on the 2-core machine the suite runs on (one launch per run, nothing else
# changed), test AUC over runs:
#   geo   (15 runs, the failing run of issue 26 among them):
#         0.7573 .. 0.7719, sd 0.0037 -> sync - 0.0105 .. sync + 0.0041
#   async (15 runs): 0.7678 .. 0.7704 (sd about 0.001) -> sync + 0.0000 .. sync + 0.0026
# Both means sit on sync's AUC (what the test is about). The bounds: geo 0.025 is about
# 6.5 sd of the 15-run spread and more than twice the farthest run seen (0.0105 below
# sync); async 0.01 is several times its whole range. A correct run fails with odds far
# below 1 in 100,000, while a mode that stopped exchanging updates (each worker on half
# the data, stale rows) loses more. The old 0.01 for geo was under 3 sd: it failed one
# clean run in about twenty.
CONVERGE_TOLERANCE = {"async": 0.01, "geo": 0.025}


@pytest.mark.parametrize("mode", ["async", "geo"])
def test_async_and_geo_converge_like_sync(planted_data, sync_auc, mode, tmp_path):
    folder, meta = planted_data
    args = [
        "--train",
        str(folder / "train"),
        "--test",
        str(folder / "test"),
        "--keys",
        str(folder / "keys.npy"),
    ]
    auc = launch(
        tmp_path, *args, "--mode", mode, "--batch-size", "64", "--k-steps", "10", servers=1
    )["summary"]["test_auc"]
    print(f"{mode}: test AUC {auc:.4f}, sync {sync_auc:.4f}, planted {meta['bayes_auc_test']:.4f}")
    assert sync_auc > 0.65, sync_auc
    assert abs(auc - sync_auc) < CONVERGE_TOLERANCE[mode], (mode, auc, sync_auc)


# Heter mode (2 trainers + 1 heter worker, the dense network there) on the same job. Like
# async mode it is a draw (measured, 5 runs: 0.7683 .. 0.7712, sync + 0.0005 .. + 0.0034;
# async above: sync + 0.0000 .. + 0.0026), so its anchor is sync's deterministic AUC: not
# worse than it by 0.005 (the bound; the lowest run seen is above sync), and not
# further above it than async may be (a split that lost updates would land below).
HETER_BELOW, HETER_ABOVE = 0.005, CONVERGE_TOLERANCE["async"]


def test_heter_workers_train_like_async(planted_data, sync_auc, tmp_path):
    folder, _ = planted_data
    got = launch(
        tmp_path, "--train", str(folder / "train"), "--test", str(folder / "test"), "--keys",
        str(folder / "keys.npy"), "--mode", "async", "--batch-size", "64", servers=1,
        launcher=("--heter-worker-num", "1"),
    )["summary"]  # fmt: skip
    auc, timings = got["test_auc"], got["timings"]
    print(f"heter: test AUC {auc:.4f}, sync {sync_auc:.4f}, timings {timings}")
    assert -HETER_BELOW < auc - sync_auc < HETER_ABOVE, (auc, sync_auc)
    # the steps ran on the heter worker (its busy seconds came back with the pass), and
    # the trainer computed only the embeddings and the backward into its rows
    assert timings["heter_busy_s"] > 0 and timings["heter_idle_s"] >= 0, timings
    assert "heter_wait_s" in timings, timings
    log = (tmp_path / "log" / "heter_worker.0.log").read_text()
    assert "running heter worker 0" in log and "stopped" in log, log[-2000:]
    # the job left the mode to the launch, which has heter workers: Heter()
    assert "training mode Heter(window=2" in (tmp_path / "log" / "worker.0.log").read_text()


def test_sync_mode_names_collective_timeout_when_a_worker_never_joins(tmp_path):
    out = tmp_path / "straggler.json"
    cmd = [
        sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1", "--worker-num", "2",
        "--log-dir", str(tmp_path / "log"), str(JOB.parent / "straggler_job.py"),
        "--out", str(out), "--timeout", "2",
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["error"] == "DeadlineError" and got["setting"] == "Strategy.collective_timeout"
    assert "raise Strategy.collective_timeout" in got["message"]
    # the strategy's limit, not the process group's 1800 s: the collective gave up after
    # its 2 s; the whole call also holds the pass's start and the automatic stack dump
    # (up to AUTO_TIMEOUT_S waiting for every role's dump), which a loaded box stretches
    # (7.3 s in all once on CI, the collective's own wait 2.003 s)
    assert 1.9 <= got["seconds"] < 6.0, got
    assert got["seconds"] <= got["waited"] < got["seconds"] + AUTO_TIMEOUT_S + 20, got


# Hybrid mode and async mode with push merging on the same job: like async they are a
# draw (which pushes a pull sees depends on timing), anchored on sync's deterministic AUC
# by the bound (not worse by 0.005) and by async's (not above by 0.01). Measured
# on the 2-core machine (one launch per run): hybrid 0.7690, 0.7683, 0.7685 (sync +
# 0.0005 .. + 0.0012); before it merged its
# pushes over 2 steps and scaled them as sync does, 0.7691, 0.7689, 0.7691; async with
# push_merge="on", window 4: 0.7677, 0.7669, 0.7659, 0.7676, 0.7652 (sync - 0.0001 ..
# - 0.0026; window 8: - 0.0023, - 0.0025: one Adagrad step with the summed gradient of
# several steps, and later rows, cost a little AUC on this job).
MERGED_BELOW, MERGED_ABOVE = 0.005, CONVERGE_TOLERANCE["async"]


def test_hybrid_mode_trains_like_sync_with_identical_dense_on_every_worker(
    planted_data, sync_auc, tmp_path
):
    folder, _ = planted_data
    got = launch(
        tmp_path, "--train", str(folder / "train"), "--test", str(folder / "test"), "--keys",
        str(folder / "keys.npy"), "--mode", "hybrid", "--batch-size", "64", "--dense-out",
        str(tmp_path / "dense"), servers=1,
    )["summary"]  # fmt: skip
    auc = got["test_auc"]
    print(f"hybrid: test AUC {auc:.4f}, sync {sync_auc:.4f}, timings {got['timings']}")
    assert -MERGED_BELOW < auc - sync_auc < MERGED_ABOVE, (auc, sync_auc)
    # the dense all-reduce kept both workers' dense parameters bit-identical (a worker
    # whose data ran out first kept stepping with empty steps until the other's did)
    first, second = (np.load(tmp_path / "dense" / f"{rank}.npy") for rank in range(2))
    np.testing.assert_array_equal(first, second)
    assert got["timings"]["push_s"] > 0  # the sparse gradients went through the push queue


def test_async_mode_with_push_merging_trains_like_sync(planted_data, sync_auc, tmp_path):
    folder, _ = planted_data
    got = launch(
        tmp_path, "--train", str(folder / "train"), "--test", str(folder / "test"), "--keys",
        str(folder / "keys.npy"), "--mode", "async", "--batch-size", "64", "--push-merge", "on",
        "--push-merge-window", "4", servers=1,
    )["summary"]  # fmt: skip
    auc, pushed = got["test_auc"], got["push_rows"]
    print(f"async + push merging: test AUC {auc:.4f}, sync {sync_auc:.4f}, rows {pushed}")
    assert -MERGED_BELOW < auc - sync_auc < MERGED_ABOVE, (auc, sync_auc)
    # the pushes were merged: repeated keys of 4 steps went out as one row each
    held, sent = pushed
    assert 0 < sent < 0.8 * held, pushed
