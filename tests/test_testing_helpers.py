"""sparseps.testing's own helpers: run_ranks stops every rank by pid; FakeClock only moves forward."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparseps.testing import FakeClock, run_ranks

SCRIPT = """
import os, sys, time
rank = int(sys.argv[1])
open(sys.argv[2] + f"/{rank}.pid", "w").write(str(os.getpid()))
print(f"rank {rank} of {sys.argv[3]} started at", time.monotonic_ns(), flush=True)
if sys.argv[4] == "hang" and rank == 1:
    time.sleep(600)
sys.exit(3 if sys.argv[4] == "fail" and rank == 0 else 0)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "rank.py"
    path.write_text(SCRIPT)
    return path


def test_ranks_run_with_their_arguments_and_a_failure_names_every_rank(script, tmp_path):
    results = run_ranks(script, 3, lambda r: [r, tmp_path, 3, "ok"], timeout_s=60)
    assert [r.returncode for r in results] == [0, 0, 0]
    assert [r.output.split(" started")[0] for r in results] == [f"rank {r} of 3" for r in range(3)]
    with pytest.raises(AssertionError, match=r"(?s)rank 0: exit 3.*rank 1: exit 0"):
        run_ranks(script, 2, lambda r: [r, tmp_path, 2, "fail"], timeout_s=60)
    codes = run_ranks(script, 2, lambda r: [r, tmp_path, 2, "fail"], timeout_s=60, check=False)
    assert [r.returncode for r in codes] == [3, 0]


def test_a_hanging_rank_is_killed_at_the_deadline_and_none_is_left(script, tmp_path):
    start = time.monotonic()
    results = run_ranks(script, 2, lambda r: [r, tmp_path, 2, "hang"], timeout_s=5, check=False)
    assert time.monotonic() - start < 60
    assert results[0].returncode == 0 and results[1].returncode is None
    assert "killed at the 5 s deadline" in results[1].output
    pids = [int((tmp_path / f"{r}.pid").read_text()) for r in range(2)]
    assert not any(_running(pid) for pid in pids)


def test_rank0_last_starts_rank_zero_after_the_others(script, tmp_path):
    started = []  # argv(rank) is asked for as each rank starts

    def argv(rank):
        started.append(rank)
        return [rank, tmp_path, 3, "ok"]

    results = run_ranks(script, 3, argv, timeout_s=60, rank0_last=True)
    assert started == [2, 1, 0] and [r.rank for r in results] == [0, 1, 2]
    run_ranks(script, 3, argv, timeout_s=60)
    assert started[3:] == [0, 1, 2]


def _running(pid: int) -> bool:
    """Alive and not a zombie (its state in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_fake_clock_moves_only_forward_and_only_when_told():
    clock = FakeClock(start=5.0)
    assert clock() == 5.0 and clock() == 5.0
    assert clock.advance(0.25) == 5.25 and clock() == 5.25
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)
