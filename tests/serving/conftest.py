"""Shared fixtures of the serving tests: one real inference chain per session.

``chain`` runs ``jobs/chain_job.py`` once (local mode: one background server, one
worker; a pass of 400 rows before each save): ``base-00000``, thirteen deltas,
``base-00014`` and ``delta-00015``, plus the last base's head as TorchScript
(``legacy_head.pt``) for the legacy-format test. Tests copy saves out of it.

``service`` is one ``sparseps serve --workers 2`` (a supervisor and two worker processes,
real uvicorns on one free loopback port) for the session, over ``served`` (a folder that starts as ``base-00000`` + three
deltas; ``test_hot_reload`` lands the rest while it serves). Starting a service costs
seconds (torch import, the first head load), so the HTTP tests and the hot-reload test
share it; the HTTP tests check whatever chain is served at the time against
``sparseps predict`` on the same folder, so they pass in any order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparseps.data.synthetic import write_dataset
from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "chain_job.py"
SAVES = "b," + "d," * 13 + "b,d"
FIRST_SERVED = 4  # base-00000 + three deltas


@dataclass(frozen=True)
class Chain:
    source: Path  # every save the job wrote
    saves: list[str]  # their folder names, in order
    test_file: Path  # Criteo TSV rows to predict
    legacy_head: Path

    def folder(self, name: str) -> Path:
        return self.source / name


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Predictors in this process run as the service does (``--torch-threads 1``); on the
    shared 2-core box two OpenMP threads per call made each call many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class ChainJob:
    """``jobs/chain_job.py`` running in the background (local mode), killed by its pid at
    the end of the session if it is still running."""

    def __init__(self, work: Path) -> None:
        self.work = work
        write_dataset(work / "data", rows=400, seed=3, files=1, test_rows=200)
        env = clean_environ()
        self.log = open(work / "job.log", "wb")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
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
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def failure(self) -> str:
        return (self.work / "job.log").read_text(errors="replace")[-3000:]

    def wait_for(self, name: str, timeout: float = 180.0) -> Path:
        """The save folder ``name`` once its manifest is written."""
        folder = self.work / "model" / name
        deadline = time.monotonic() + timeout
        while not (folder / "MANIFEST.json").is_file():
            assert self.process.poll() is None, f"chain job exited early:\n{self.failure()}"
            assert time.monotonic() < deadline, f"no {name} within {timeout} s:\n{self.failure()}"
            time.sleep(0.1)
        return folder

    def finish(self, timeout: float = 180.0) -> Chain:
        code = self.process.wait(timeout)
        assert code == 0, self.failure()
        saves = json.loads((self.work / "summary.json").read_text())["saves"]
        assert saves[0] == "base-00000" and saves[14] == "base-00014" and len(saves) == 16
        test_file = next((self.work / "data" / "test").iterdir())
        return Chain(self.work / "model", saves, test_file, self.work / "legacy_head.pt")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.log.close()


@pytest.fixture(scope="session")
def chain_job(tmp_path_factory):
    job = ChainJob(tmp_path_factory.mktemp("chain"))
    yield job
    job.close()


@pytest.fixture(scope="session")
def chain(chain_job) -> Chain:
    return chain_job.finish()


@pytest.fixture(scope="session")
def served(chain_job, tmp_path_factory) -> Path:
    """Starts as base-00000 + three deltas, landed as soon as the job wrote them (the
    service then starts while the job writes the rest)."""
    from _servetools import land

    model = tmp_path_factory.mktemp("served") / "model"
    for name in ["base-00000", *(f"delta-{i:05d}" for i in range(1, FIRST_SERVED))]:
        land(chain_job.wait_for(name), model)
    return model


@pytest.fixture(scope="session")
def service(served):
    from _servetools import WORKERS

    from sparseps.serving import ServeProcess

    extra = ["--max-rows", "1000", "--max-body-mb", "0.5"]
    with ServeProcess(served, poll_s=0.05, extra_args=extra, workers=WORKERS) as process:
        yield process


@pytest.fixture(scope="session")
def client(service):
    import httpx

    with httpx.Client(base_url=service.url, timeout=30) as c:
        yield c
