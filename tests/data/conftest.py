"""Shared fixtures of the data tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseps.rpc.transport import free_port

WORKER = Path(__file__).resolve().with_name("data_shuffle_worker.py")


@pytest.fixture(scope="session")
def global_shuffles(tmp_path_factory) -> dict[str, list[dict[str, np.ndarray]]]:
    """The global shuffles of two worker processes (gloo on loopback), for two tests:
    ``plain`` (test_data_datasets.py: Criteo files of 300, 200, 250 and 150 rows) and
    ``extra`` (test_data_extra_labels.py: the same row counts with an extra label column).
    One pair of processes shuffles both data sets in turn: each process start is seconds
    of imports, and each shuffle is its own load, shuffle and dump. Returns name -> each
    rank's arrays (ids, labels, c1, before[, extra])."""
    from test_data_datasets import write_files  # the test folder is on sys.path
    from test_data_extra_labels import _extra_files

    root = tmp_path_factory.mktemp("global-shuffle")
    write_files(root / "plain", [300, 200, 250, 150])  # worker 0: files 0, 2; worker 1: 1, 3
    _extra_files(root / "extra", [300, 200, 250, 150])
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(rank),
                "2",
                str(port),
                str(root / "plain"),
                str(root / f"plain{rank}.npz"),
                "--",
                str(root / "extra"),
                str(root / f"extra{rank}.npz"),
                "extra",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for rank in range(2)
    ]
    try:
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out.decode()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return {
        name: [dict(np.load(root / f"{name}{rank}.npz")) for rank in range(2)]
        for name in ("plain", "extra")
    }
