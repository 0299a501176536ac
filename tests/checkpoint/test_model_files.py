"""Model files end to end: checkpoints across server counts, resume, inference models.

Every job is a real ``sparseps launch`` (servers and workers on loopback) running
``tests/worker/jobs/train_job.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.feather as feather
import pytest

from sparseps.cli import main as cli_main
from sparseps.data.synthetic import write_dataset
from sparseps.files import manifest as mf
from sparseps.testing import wait_until
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "worker" / "jobs" / "train_job.py"
LOAD_JOB = ROOT / "tests" / "checkpoint" / "jobs" / "model_job.py"


def _env(**extra) -> dict:
    return clean_environ(**extra)


def _cmd(tmp: Path, servers: int, workers: int, *args: str, grace_s: float = 5.0) -> list[str]:
    return [
        sys.executable, "-m", "sparseps.cli", "launch", "--server-num", str(servers), "--worker-num",
        str(workers), "--log-dir", str(tmp / "log"), "--grace-s", str(grace_s), str(JOB),
        "--out", str(tmp / "out.npz"), *args,
    ]  # fmt: skip


def launch(tmp: Path, *args: str, servers: int = 2, workers: int = 2) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        _cmd(tmp, servers, workers, *args),
        cwd=tmp,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp / "out.npz.json").read_text())


def read_checkpoint(directory: Path) -> dict:
    """Every table's rows (sorted by key, all columns) and the dense arrays of a checkpoint."""
    manifest = mf.verify(directory)
    out = {}
    for name, entry in manifest["tables"].items():
        for kind in ("shard", "pending"):
            tables = [feather.read_table(directory / f) for f in entry["files"] if f".{kind}-" in f]
            columns = {
                c: np.concatenate([t.column(c).to_numpy(zero_copy_only=False) for t in tables])
                for c in tables[0].column_names
            }
            order = np.argsort(columns["key"], kind="stable")
            for column, values in columns.items():
                values = values[order]
                if values.dtype == object:  # fixed-size lists -> 2-D
                    values = np.stack(values) if len(values) else values
                out[f"{name}.{kind}.{column}"] = values
    with np.load(directory / manifest["dense"]["file"]) as dense:
        out.update({f"dense.{k}": dense[k] for k in dense.files})
    return out


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert np.array_equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_dataset(folder, rows=600, seed=3, files=2, test_rows=300)
    np.save(folder / "keys.npy", np.zeros(1, np.uint64))
    return folder


@pytest.fixture(scope="module", autouse=True)
def predictor_job(data, tmp_path_factory):
    """The job of test_predictor_reproduces_..., started with the module in a thread: it
    runs beside the first tests' jobs (their checks and its own are of values, not
    timing) and is done before test_server_killed_... starts (the test before waits).
    Yields (future of its summary, its inference folder)."""
    root = tmp_path_factory.mktemp("predictor")
    model = root / "infer"
    args = _args(data, "--mode", "sync", "--predict-check", str(model), "--shrink-score", "0.5")
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(launch, root / "a", *args, workers=1), model


def _args(data: Path, *more: str) -> list[str]:
    # batches of 64, not 16: a quarter of the steps (each a round trip to every server,
    # and in sync mode a wait for the other worker); no check here depends on the batch
    return [
        "--batch-size",
        "64",
        "--train",
        str(data / "train"),
        "--test",
        str(data / "test"),
        "--keys",
        str(data / "keys.npy"),
        *more,
    ]


@pytest.fixture(scope="module")
def save_jobs(data, tmp_path_factory):
    """The jobs of the two tests below, started together as three chains of launches (the
    checks of both tests are of saved values, none of timing; sync mode makes what the
    resume test's jobs save independent of timing): each launch keeps about one of two
    cores busy, and one after another they were ~50 s of this module. Returns
    name -> future of the chain's checkpoint folders."""
    root = tmp_path_factory.mktemp("saves")

    def two_then_three():  # async: the dense model lives on the servers too
        first, again = root / "ckpt2", root / "ckpt3"
        launch(root / "a", *_args(data, "--mode", "async", "--save", str(first)), servers=2)
        launch(
            root / "b",
            *_args(
                data, "--mode", "async", "--passes", "0", "--load", str(first), "--save",
                str(again),
            ),
            servers=3,
        )  # fmt: skip
        return first, again

    def straight():
        folder = root / "straight"
        launch(root / "c", *_args(data, "--mode", "sync", "--passes", "4", "--save", str(folder)))
        return folder

    def half_then_resumed():
        half, resumed = root / "half", root / "resumed"
        launch(root / "d", *_args(data, "--mode", "sync", "--passes", "2", "--save", str(half)))
        launch(
            root / "e",
            *_args(
                data, "--mode", "sync", "--passes", "2", "--load", str(half), "--save",
                str(resumed),
            ),
        )  # fmt: skip
        return resumed

    with ThreadPoolExecutor(max_workers=3) as pool:
        yield {
            "two_then_three": pool.submit(two_then_three),
            "straight": pool.submit(straight),
            "resumed": pool.submit(half_then_resumed),
        }


def test_save_with_two_servers_load_with_three_is_bit_identical(save_jobs):
    first, again = save_jobs["two_then_three"].result()
    saved, reloaded = read_checkpoint(first), read_checkpoint(again)
    assert saved["deep_emb.shard.key"].size > 1000
    assert_same(saved, reloaded)
    assert mf.read_manifest(again)["tables"]["deep_emb"]["servers"] == 3


def test_resume_equals_uninterrupted_training(save_jobs):
    # 4 passes straight, against 2 passes saved, loaded by a fresh job and trained 2 more
    straight, resumed = save_jobs["straight"].result(), save_jobs["resumed"].result()
    assert_same(read_checkpoint(straight), read_checkpoint(resumed))
    assert mf.read_manifest(resumed)["state"]["passes"] == 4


def test_predictor_reproduces_the_trainer_for_base_and_deltas_after_shrink(predictor_job):
    summary, model = predictor_job[0].result(), predictor_job[1]
    assert len(summary["predict_diffs"]) == 3
    assert max(summary["predict_diffs"]) < 1e-6, summary["predict_diffs"]
    assert summary["deleted"]["deep_emb"] > 0  # shrink deleted rows: the deltas carry tombstones
    manifest = mf.read_manifest(model / "delta-00002")
    assert manifest["tables"]["deep_emb"]["tombstones"] > 0


@pytest.mark.parametrize("same_folder", [False, True], ids=["new-folder", "same-folder"])
def test_server_killed_during_a_save_leaves_the_previous_checkpoint_usable(
    data, tmp_path, same_folder, capsys
):
    good, marker = tmp_path / "good", tmp_path / "stalled"
    # the stalled save goes to a new folder, or over the good checkpoint itself
    target = good if same_folder else tmp_path / "broken"
    work = tmp_path / "a"
    work.mkdir()
    args = _args(
        data,
        "--mode",
        "async",
        "--save",
        str(good),
        "--save-stalled",
        str(target),
        "--marker",
        str(marker),
    )
    proc = subprocess.Popen(
        # the job fails once the server is killed: its other server, which took over 5 s
        # to exit after SIGTERM here, gets SIGKILL after 1 s (nothing it does is checked)
        _cmd(work, 2, 2, *args, grace_s=1.0),
        cwd=work,
        env=_env(SPARSEPS_RPC_TIMEOUT="15"),  # notices the dead server, tolerates a busy machine
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def stalled() -> bool:
            assert proc.poll() is None, "the job ended before it reached the stalled save"
            return marker.exists()

        wait_until(stalled, 120, "the job to reach the stalled save", interval=0.1)
        good_manifest = (good / mf.MANIFEST).read_bytes()
        server = json.loads((work / "log" / "pids.json").read_text())
        pid = _server_pid(server, 1)
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    # the half-written save is beside its target, never at it
    [half] = [p for p in tmp_path.iterdir() if p.name.startswith(f".{target.name}.saving-")]
    assert any(half.glob("deep_emb.shard-*.arrow")) and not (half / mf.MANIFEST).exists()
    if same_folder:
        assert (good / mf.MANIFEST).read_bytes() == good_manifest
    # the previous one loads into a fresh job with another server count: that job reads
    # the good checkpoint only, so it runs beside the checks below
    with ThreadPoolExecutor(max_workers=1) as pool:
        loaded = pool.submit(
            launch,
            tmp_path / "b",
            *_args(data, "--mode", "async", "--passes", "0", "--load", str(good)),
            servers=3,
        )
        if not same_folder:
            # reported as an interrupted save by inspect and by a trainer's load, not loaded
            code, out = _inspect(capsys, target)
            assert code != 0 and "interrupted" in out, out
            [error] = _load_errors(tmp_path / "c", data, target)
            assert str(target) in error and "interrupted" in error and half.name in error
        # ... and verifies
        code, out = _inspect(capsys, good)
        assert code == 0, out
        loaded.result()


def _inspect(capsys, folder: Path) -> tuple[int, str]:
    """``sparseps inspect FOLDER``'s exit code and stdout, run in this process (reads files
    only; a fresh interpreter cost 3-5 s of imports per call here)."""
    capsys.readouterr()
    code = cli_main(["inspect", str(folder)])
    return code, capsys.readouterr().out


def _load_errors(work: Path, data: Path, target: Path) -> list[str]:
    """What trainer.load_checkpoint(target) raises, in a local-mode job of the same model."""
    work.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            str(LOAD_JOB),
            "--train",
            str(data / "train"),
            "--test",
            str(data / "test"),
            "--out",
            str(work / "out.json"),
            "--steps",
            f"load={target}",
        ],  # fmt: skip
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((work / "out.json").read_text())["load_errors"]


def _server_pid(pids: dict, rank: int) -> int:
    for entry in pids["children"]:
        if entry.get("role") == "server" and entry.get("rank") == rank:
            return int(entry["pid"])
    raise AssertionError(f"no server {rank} in pids.json: {pids}")
