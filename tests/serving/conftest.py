"""Shared fixtures of the serving tests: one real inference chain per session.

``chain`` runs ``jobs/chain_job.py`` once (local mode: one background server, one
worker; a pass of 600 rows before each save): ``base-00000``, ten deltas, ``base-00011``
and ``delta-00012``, plus the last head as TorchScript (``legacy_head.pt``) for the
legacy-format test. Tests copy saves out of it into their own model folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparseps.data.synthetic import write_dataset

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "chain_job.py"
SAVES = "b," + "d," * 10 + "b,d"


@dataclass(frozen=True)
class Chain:
    source: Path  # every save the job wrote
    saves: list[str]  # their folder names, in order
    test_file: Path  # Criteo TSV rows to predict
    legacy_head: Path

    def folder(self, name: str) -> Path:
        return self.source / name


@pytest.fixture(scope="session")
def chain(tmp_path_factory) -> Chain:
    work = tmp_path_factory.mktemp("chain")
    write_dataset(work / "data", rows=600, seed=3, files=1, test_rows=200)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [
            sys.executable,
            str(JOB),
            "--train",
            str(work / "data" / "train"),
            "--model",
            str(work / "model"),
            "--saves",
            SAVES,
            "--legacy-head",
            str(work / "legacy_head.pt"),
            "--out",
            str(work / "summary.json"),
        ],  # fmt: skip
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    saves = json.loads((work / "summary.json").read_text())["saves"]
    assert saves[0] == "base-00000" and saves[11] == "base-00011" and len(saves) == 13
    test_file = next((work / "data" / "test").iterdir())
    return Chain(work / "model", saves, test_file, work / "legacy_head.pt")
