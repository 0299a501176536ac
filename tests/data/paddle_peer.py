"""Paddle 2.6.2 beside the tests: where its environment is, and the bytes it wrote.

Two tests compare what a Paddle generator script prints under Paddle's own
``MultiSlotDataGenerator`` and under sparseps': tests/data/test_paddlerec_readers.py
(PaddleRec's readers) and tests/data/test_paddle_generator_parity.py (every method of
the generator classes). Where Paddle's environment exists they run both; everywhere they
compare sparseps' output with the bytes Paddle printed, kept under tests/fixtures. After
changing a script or an input, write those bytes again with Paddle 2.6.2 in
``$PADDLE_VENV`` (default ``/tmp/paddle-2.6.2-venv``)::

    python3.11 -m venv /tmp/paddle-2.6.2-venv
    /tmp/paddle-2.6.2-venv/bin/pip install paddlepaddle==2.6.2 "numpy<2" \\
        "protobuf>=4.21,<7" pyyaml xxhash
    .venv/bin/python tests/data/paddle_peer.py --write-expected
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PADDLE_VERSION = "2.6.2"


def paddle_python() -> Path:
    return Path(os.environ.get("PADDLE_VENV", f"/tmp/paddle-{PADDLE_VERSION}-venv")) / "bin/python"


def paddle_missing() -> str | None:
    """Why Paddle's side cannot run here (None: it can)."""
    python = paddle_python()
    venv = python.parents[1]
    make = (
        f"make it with: python3.11 -m venv {venv} && {venv}/bin/pip install "
        f'paddlepaddle=={PADDLE_VERSION} "numpy<2" "protobuf>=4.21,<7" pyyaml xxhash'
    )
    if not python.is_file():
        return f"no Paddle {PADDLE_VERSION} environment at {venv} ($PADDLE_VENV); {make}"
    check = (
        "import sys, yaml, xxhash, paddle.distributed.fleet as f; "
        f"sys.exit(__import__('paddle').__version__ != {PADDLE_VERSION!r})"
    )
    done = subprocess.run([str(python), "-c", check], capture_output=True, text=True)
    if done.returncode != 0:
        return f"{python} lacks Paddle {PADDLE_VERSION}, pyyaml or xxhash; {make}"
    return None


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a script runs in: no PYTHON* or SPARSEPS_* of ours, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SPARSEPS_"))}
    return {**env, **extra}


def git_blob_id(data: bytes) -> str:
    """What ``git hash-object`` prints for a file of these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def stdout_of(done: subprocess.CompletedProcess, what: str) -> bytes:
    if done.returncode != 0:
        raise AssertionError(f"{what} failed:\n{done.stderr.decode()[-3000:]}")
    return done.stdout


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-expected"]:
        raise SystemExit(__doc__)
    missing = paddle_missing()
    if missing:
        raise SystemExit(missing)
    import generator_probe  # the test folder: this script's own
    import paddlerec_readers

    for path, size in [*paddlerec_readers.write_expected(), *generator_probe.write_expected()]:
        print(f"{path.relative_to(ROOT)}: {size} bytes")
