"""The cases of tests/data/jobs/paddle_generator_cases.py, run under Paddle or sparseps.

Each case is a small generator script run on tests/fixtures/paddle_generator/lines.txt;
the bytes Paddle 2.6.2 printed for it are kept in tests/fixtures/paddle_generator/expected
(``paddle_peer.py --write-expected`` writes them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from paddle_peer import ROOT, clean_env, paddle_python

SCRIPT = ROOT / "tests" / "data" / "jobs" / "paddle_generator_cases.py"
FOLDER = ROOT / "tests" / "fixtures" / "paddle_generator"
LINES = FOLDER / "lines.txt"
EXPECTED = FOLDER / "expected"

# case -> its exit code under Paddle ("fails" stops on a value that is not a number)
CASES = {
    "zips": 0,
    "shapes": 0,
    "batched": 0,
    "default_batch": 0,
    "memory": 0,
    "strings": 0,
    "string_batches": 0,
    "talks": 0,
    "fails": 1,
}


def run_case(case: str, *, paddle: bool) -> subprocess.CompletedProcess:
    """The case's script on the kept lines, with Paddle's classes or sparseps'."""
    python = paddle_python() if paddle else Path(sys.executable)
    env = clean_env(GENERATOR="paddle" if paddle else "sparseps", PYTHONPATH=str(ROOT))
    with open(LINES, "rb") as stdin:
        return subprocess.run(
            [str(python), str(SCRIPT), case], stdin=stdin, capture_output=True, env=env,
            timeout=120,
        )  # fmt: skip


def expected(case: str) -> Path:
    return EXPECTED / f"{case}.txt"


def write_expected() -> list[tuple[Path, int]]:
    """Run every case under Paddle; keep what it printed."""
    EXPECTED.mkdir(exist_ok=True)
    written = []
    for case, code in CASES.items():
        done = run_case(case, paddle=True)
        if done.returncode != code:
            raise SystemExit(f"{case}: exit code {done.returncode} under Paddle, not {code}:\n"
                             f"{done.stderr.decode()[-3000:]}")  # fmt: skip
        expected(case).write_bytes(done.stdout)
        written.append((expected(case), len(done.stdout)))
    return written
