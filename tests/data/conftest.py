"""Shared fixtures of the data tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparseps.rpc.transport import free_port
from sparseps.testing import run_ranks

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
    run_ranks(WORKER, 2, lambda rank: [rank, 2, port, root / "plain", root / f"plain{rank}.npz",
                                       "--", root / "extra", root / f"extra{rank}.npz", "extra"],
              timeout_s=120)  # fmt: skip
    return {
        name: [dict(np.load(root / f"{name}{rank}.npz")) for rank in range(2)]
        for name in ("plain", "extra")
    }
