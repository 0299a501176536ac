"""Heter in sync mode (issue 57, item 3): 2 trainers and a heter worker train as sync
mode does, one dense step of the global batch per step, the sparse gradients summed once:
the tables, the dense parameters and the test AUC equal a plain sync job's (float
rounding apart: the heter worker sums the global batch's dense gradient in one backward,
sync mode all-reduces two halves)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseps.data import CRITEO, QueueDataset
from sparseps.data.synthetic import write_dataset
from sparseps.testing.environ import clean_environ

JOB = Path(__file__).resolve().parents[1] / "worker" / "jobs" / "train_job.py"
pytestmark = pytest.mark.timeout(400)


def _launch(tmp: Path, data: Path, mode: str, launcher: tuple[str, ...] = ()) -> dict:
    out = tmp / "out.npz"
    cmd = [
        sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1", "--worker-num", "2",
        "--log-dir", str(tmp / "log"), *launcher, str(JOB), "--out", str(out),
        "--train", str(data / "train"), "--test", str(data / "test"), "--keys",
        str(data / "keys.npy"), "--mode", mode, "--batch-size", "64",
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=tmp, env=clean_environ(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with np.load(out) as found:
        arrays = {k: found[k] for k in found.files}
    arrays["summary"] = json.loads(Path(str(out) + ".json").read_text())
    return arrays


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory) -> tuple[Path, dict]:
    """The data and a plain sync job's result on it."""
    tmp = tmp_path_factory.mktemp("heter-sync")
    data = tmp / "data"
    write_dataset(data, rows=6000, seed=17, files=2, test_rows=2000)
    batches = list(QueueDataset([str(data / "train")], CRITEO, batch_size=512, threads=1))
    keys = np.unique(np.concatenate([s.values for b in batches for s in b.slots.values()]))
    np.save(data / "keys.npy", keys[:: max(1, keys.size // 500)])  # 500 keys' rows compared
    (tmp / "sync").mkdir()
    return data, _launch(tmp / "sync", data, "sync")


@pytest.mark.parametrize("heter_workers", [1, 2])
def test_heter_sync_trains_as_sync_mode(tmp_path, sync_run, heter_workers):
    # with 2 heter workers the steps alternate between them (step i on i % 2): each pulls
    # the values the other's update left before it computes
    data, sync = sync_run
    heter = _launch(tmp_path, data, "heter_sync", ("--heter-worker-num", str(heter_workers)))
    steps = batches = 0
    for rank in range(heter_workers):
        log = (tmp_path / "log" / f"heter_worker.{rank}.log").read_text()
        found = re.search(r"after (\d+) steps in (\d+) device", log)
        assert found is not None, log[-2000:]
        steps, batches = steps + int(found.group(1)), batches + int(found.group(2))
        assert int(found.group(2)) > 5, log[-2000:]  # every heter worker took steps
    # every step ran on a heter worker, the two trainers' requests as one device batch
    assert batches > 10 and steps == 2 * batches, (steps, batches)
    s_auc, h_auc = sync["summary"]["test_auc"], heter["summary"]["test_auc"]
    print(f"\nsync AUC {s_auc:.6f}, heter sync ({heter_workers} heter workers) {h_auc:.6f}; "
          f"{batches} device batches")  # fmt: skip
    assert abs(s_auc - h_auc) < 1e-3
    np.testing.assert_allclose(heter["dense"], sync["dense"], atol=2e-3)
    for name in (k for k in sync if k.startswith("table.")):
        np.testing.assert_allclose(heter[name], sync[name], atol=2e-3, err_msg=name)
