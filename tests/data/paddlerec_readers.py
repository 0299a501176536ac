"""PaddleRec's MultiSlot readers, run as PaddleRec runs them, under Paddle and under sparseps.

The readers are kept exactly as published under ``tests/fixtures/paddlerec/upstream/``
(README.md there: where each comes from, its licence). PaddleRec's trainer runs a reader
as ``python reader.py CONFIG.yaml UTILS_DIR`` (``tools/utils/static_ps/reader_helper.py``:
the reader imports ``common_ps`` from ``UTILS_DIR`` to read the config), one file on
stdin, and Paddle's dataset reads its stdout. :func:`run_reader` does the same with a
given interpreter; :func:`port` writes the sparseps copy of a reader, whose only change
is its import line. The expected bytes are Paddle's (``paddle_peer.py --write-expected``).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from paddle_peer import ROOT, clean_env, paddle_python, stdout_of

FIXTURES = ROOT / "tests" / "fixtures" / "paddlerec"
UPSTREAM = FIXTURES / "upstream"
INPUTS = FIXTURES / "inputs"
EXPECTED = FIXTURES / "expected"
SUPPORT = FIXTURES / "support"  # stand-ins for six and xxhash 1.x (README.md)
CONFIG = INPUTS / "config.yaml"
UTILS = UPSTREAM / "tools" / "utils" / "static_ps"  # PaddleRec's common_ps.py

PADDLE_IMPORT = "import paddle.distributed.fleet as fleet\n"
SPARSEPS_IMPORT = "import sparseps.data as fleet\n"


@dataclass(frozen=True)
class Reader:
    """One kept reader: its path in PaddleRec, the input it reads, where it runs."""

    path: str  # under UPSTREAM, as in PaddleRec
    blob: str  # its git blob id in PaddleRec at UPSTREAM_COMMIT (the file is unchanged)
    input: str  # under INPUTS (or the repository's tests/fixtures)
    yields: str  # what generate_sample yields: "zip" or "list"
    cwd: str = "."  # under INPUTS: the TDM reader opens ../builder/ids_id.txt

    @property
    def name(self) -> str:
        return self.path.removesuffix(".py").replace("/", "__")

    @property
    def expected(self) -> Path:
        return EXPECTED / f"{self.name}.txt"

    @property
    def input_path(self) -> Path:
        return (INPUTS / self.input).resolve()


UPSTREAM_COMMIT = "656326adf3c4117c11ec0eff5e8f61acd8191c2a"  # PaddleRec, 2025-04-02
READERS = (
    Reader("models/rank/wide_deep/benchmark_reader.py",
           "f70e9e07d22db0a2561c34de721e29a2082fcc02", "criteo_raw.txt", "zip"),
    Reader("models/rank/dnn/benchmark_reader.py",
           "f70e9e07d22db0a2561c34de721e29a2082fcc02", "criteo_raw.txt", "zip"),
    Reader("models/rank/deepfm/benchmark_reader.py",
           "8b147e458958e6c6dd1bb0390b4cf56f69131ad7", "criteo_raw.txt", "zip"),
    Reader("models/rank/wide_deep/benchmark_reader_lineid.py",
           "8b7d97f123d6774feabef718f24a6480f0967ea0", "criteo_lineid.txt", "zip"),
    Reader("models/match/dssm/bq_reader_train_insid.py",
           "7d39e965a95af9ec46e5c309f475da94c4fcf76a", "dssm_insid.txt", "zip"),
    Reader("models/treebased/tdm/reader.py",
           "dbc83a67d879c10f7301401c1f626cc119d59576", "tdm/data/train.txt", "zip",
           cwd="tdm/data"),
    Reader("models/rank/wide_deep/queuedataset_reader.py",
           "587f822bb4ff07ea1b46ec7d27f9a5c3a8087d1d", "../../criteo_slot_sample.txt", "list"),
    Reader("models/recall/ncf/queuedataset_reader.py",
           "0823f31bb7001ee17d48d1e95e6511790b6b2ea7", "ncf.txt", "list"),
    Reader("models/rank/slot_dnn/inmemorydataset_reader.py",
           "9a5666af885a01431a88ff879767887105324479", "slot_dnn.txt", "list"),
)  # fmt: skip
# the other files kept from PaddleRec, with their blob ids
SUPPORT_FILES = {
    "upstream/tools/utils/static_ps/common_ps.py": "c5d3919ca5f54aef07c7b3ef8ffff6c86d0e577e",
    "LICENSE": "261eeb9e9f8b2b4b0d119366dda99c6fd7d35c64",
}


def port(reader: Reader, folder: Path) -> Path:
    """The sparseps copy of ``reader`` under ``folder``: its import line changed, nothing
    else (checked here)."""
    text = (UPSTREAM / reader.path).read_text()
    assert text.count(PADDLE_IMPORT) == 1, reader.path
    ported = text.replace(PADDLE_IMPORT, SPARSEPS_IMPORT)
    changed = [
        (a, b) for a, b in zip(text.splitlines(), ported.splitlines(), strict=True) if a != b
    ]
    assert changed == [(PADDLE_IMPORT.strip(), SPARSEPS_IMPORT.strip())], changed
    path = folder / reader.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ported)
    return path


def run_reader(python: str | Path, script: Path, reader: Reader) -> subprocess.CompletedProcess:
    """``python script CONFIG UTILS_DIR < input``, as PaddleRec's trainer runs it.

    ``PYTHONHASHSEED=0``: the DeepFM and line-id readers hash with Python's ``hash()``,
    which is salted per process otherwise.
    """
    env = clean_env(PYTHONHASHSEED="0", PYTHONPATH=os.pathsep.join([str(SUPPORT), str(ROOT)]))
    with open(reader.input_path, "rb") as stdin:
        return subprocess.run(
            [str(python), str(script), str(CONFIG), str(UTILS)],
            stdin=stdin, capture_output=True, cwd=INPUTS / reader.cwd, env=env, timeout=120,
        )  # fmt: skip


def write_expected() -> list[tuple[Path, int]]:
    """Run every reader under Paddle; keep what it printed as the expected bytes."""
    EXPECTED.mkdir(exist_ok=True)
    written = []
    for reader in READERS:
        done = run_reader(paddle_python(), UPSTREAM / reader.path, reader)
        reader.expected.write_bytes(stdout_of(done, f"{reader.path} under Paddle"))
        written.append((reader.expected, len(done.stdout)))
    return written
