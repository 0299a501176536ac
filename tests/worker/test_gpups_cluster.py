"""GPUPS with 2 workers and 2 servers: real launcher, processes and sockets on loopback.

What is exactly comparable: GPUPS with W workers makes the same steps as sync mode with
W workers (the same global batches in lock-step; per key the owner sums the workers'
gradients and applies the rule once, as a server does with the sum of a sync step's
pushes; the dense gradients are all-reduced and applied by every worker in both). With
2 workers each key has at most 2 gradients per step and a float32 sum of two values does
not depend on their order, so the rows are bit-equal but for the device rules' rare last
float64 bit (docs of ``sparseps.optim.device_rules``): every key's row equals the sync
run's within 1e-6 absolute / 1e-5 relative. The workers have unequal shares (3 train
files over 2 workers), so one runs out of batches first and keeps answering the exchange
with empty contributions. The first pass trains 5 batches per worker and prepares the
second (all batches) while it runs: the second's build takes the first's final rows for
the keys they share and the other keys' rows pulled during the first by any worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from sparseps.data import CRITEO, InMemoryDataset
from sparseps.data.synthetic import write_dataset
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "gpups_job.py"


def test_two_gpups_workers_equal_two_sync_workers_on_every_key(tmp_path):
    folder = tmp_path / "data"
    write_dataset(folder, rows=600, seed=17, files=3, test_rows=100)
    everything = InMemoryDataset([str(folder / "train")], CRITEO, batch_size=4096, threads=1)
    everything.load_into_memory()
    keys = np.unique(np.concatenate([s.values for b in everything for s in b.slots.values()]))
    np.save(tmp_path / "keys.npy", keys)
    out = tmp_path / "out.npz"
    env = clean_environ()
    cmd = [
        sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "2", "--worker-num", "2",
        "--log-dir", str(tmp_path / "log"), str(JOB), "--train", str(folder / "train"),
        "--keys", str(tmp_path / "keys.npy"), "--out", str(out),
        "--checkpoint", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(Path(str(out) + ".json").read_text())
    with np.load(out) as data:
        got = {k: data[k] for k in data.files}
    # worker 0 has 2 of the 3 files: 13 batches of 32 against worker 1's 7
    assert summary["sync_batches"] == summary["gpups_batches"] == 13
    assert summary["gpups_timings"]["build_s"] > 0
    assert summary["gpups_timings"]["exchange_s"] > 0 and summary["gpups_timings"]["rule_s"] > 0
    # each worker owns about half of the keys; together every key of the data once
    assert 0.7 * keys.size < sum(summary["last_build"]["keys"].values()) < 1.3 * keys.size
    # the second pass was prepared during the first: nothing left to pull at its start
    build = summary["last_build"]
    assert build["carried"] > 0 and build["early"] > 0 and build["pulled"] == 0, build
    for table in ("deep", "wide"):
        sync, gpups = got[f"s_{table}"], got[f"g_{table}"]
        np.testing.assert_allclose(gpups, sync, rtol=1e-5, atol=1e-6)
        assert np.abs(sync).max() > 1e-2  # the rows moved (10^4 x the tolerance)
        assert summary["rows"][f"g_{table}"] == keys.size
        # checkpoint -> another pass -> load: the pulls are the checkpoint's again
        np.testing.assert_array_equal(got[f"loaded_g_{table}"], gpups)
    assert not np.array_equal(got["moved_deep"], got["g_deep"])
    np.testing.assert_allclose(got["g_dense"], got["s_dense"], rtol=1e-5, atol=1e-6)
    assert summary["test_count"] == 600
