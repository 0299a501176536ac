"""What the two Paddle ports' end-to-end tests share (tests/examples/test_*_port.py).

Each test copies its example into a folder of its own (a user's checkout), writes a few
thousand lines of data there, launches the job with ``sparseps launch`` from it, then runs
``sparseps predict`` and ``sparseps serve`` on the inference model from *another* folder
with no schema flag, and checks that both answer the same predictions.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zlib
from pathlib import Path

import httpx
import numpy as np

from sparseps.checkpoint.predictor import Predictor
from sparseps.data import QueueDataset
from sparseps.data.synthetic import write_dataset
from sparseps.serving import ServeProcess
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# PaddleRec's Criteo preprocessing of the 13 counts: (x - min) / (max - min)
CONT_MIN = (0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
CONT_DIFF = (20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50)


def git_blob(data: bytes) -> str:
    """The git blob id of ``data`` (``git hash-object``): how upstream names a file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def criteo_raw(folder: Path, rows: int, files: int, seed: int) -> tuple[list[Path], Path]:
    """Criteo's raw tab-separated lines (the planted synthetic set): train files, test file."""
    write_dataset(folder, rows=rows, seed=seed, files=files, test_rows=300)
    return sorted((folder / "train").iterdir()), next((folder / "test").iterdir())


def slot_text(raw: Path, out: Path) -> Path:
    """A raw Criteo file as PaddleRec's slot text (``click:1 dense_feature:0.05 ... 1:737395``),
    dense values scaled as PaddleRec's preprocessing does, ids hashed into 1000001."""
    lines = []
    for line in raw.read_text().splitlines():
        f = line.split("\t")
        tokens = [f"click:{f[0]}"]
        for i in range(13):
            value = 0.0 if f[1 + i] == "" else (float(f[1 + i]) - CONT_MIN[i]) / CONT_DIFF[i]
            tokens.append(f"dense_feature:{value}")
        tokens += [f"{i + 1}:{zlib.crc32(f'{i}{f[14 + i]}'.encode()) % 1000001}" for i in range(26)]
        lines.append(" ".join(tokens))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def launch(job: Path, script: str, *args: str, logs: Path) -> None:
    """``sparseps launch --server-num 1 --worker-num 2 SCRIPT ARGS`` run from ``job``."""
    argv = [sys.executable, "-m", "sparseps.cli", "launch", "--server-num", "1",
            "--worker-num", "2", "--log-dir", str(logs), script, *args]  # fmt: skip
    done = subprocess.run(argv, cwd=job, env=clean_environ(), capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    if done.returncode != 0:
        tails = [f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in
                 sorted(logs.glob("*.log"))]  # fmt: skip
        raise AssertionError(done.stdout[-2000:] + done.stderr[-2000:] + "\n".join(tails))


def predict(model: Path, data: Path, cwd: Path) -> np.ndarray:
    """``sparseps predict MODEL --data DATA`` with no other flag, run from ``cwd``."""
    argv = [sys.executable, "-m", "sparseps.cli", "predict", str(model), "--data", str(data)]
    done = subprocess.run(argv, cwd=cwd, env=clean_environ(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return np.array([float(x) for x in done.stdout.split()], np.float64)


def request_rows(model: Path, data: Path) -> list[dict]:
    """``data`` as a client sends it to the model: the rows its reader makes (as the model
    records it), each column as the request schema names it (a dense name the schema
    repeats is one list; a slot, its integer ids)."""
    source = Predictor(model).input
    assert source is not None
    schema = source.schema
    widths = {name: schema.dense.count(name) for name in dict.fromkeys(schema.dense)}
    rows: list[dict] = []
    for batch in QueueDataset([str(data)], schema, 1000, format=source.format,
                              pipe_command=source.command(), rank=0, world=1):  # fmt: skip
        for i in range(len(batch)):
            row: dict = {}
            for name, width in widths.items():
                values = [float(batch.dense[i, j]) for j, n in enumerate(schema.dense) if n == name]
                row[name] = values if width > 1 else values[0]
            for name, slot in batch.slots.items():
                row[name] = [int(v) for v in slot.values[slot.offsets[i] : slot.offsets[i + 1]]]
            rows.append(row)
    return rows


def serve(model: Path, rows: list[dict]) -> tuple[np.ndarray, dict]:
    """What ``sparseps serve MODEL`` (no flag) answers for ``rows``, and its ``/model``."""
    with ServeProcess(model, poll_s=60, start_timeout=240) as service:
        answer = httpx.post(service.url + "/predict", json={"rows": rows}, timeout=120)
        assert answer.status_code == 200, answer.text
        described = httpx.get(service.url + "/model", timeout=60).json()
    return np.array(answer.json()["predictions"], np.float64), described
