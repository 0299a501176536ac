"""Run one script as N ranks, each its own process, and stop them all by pid.

Multi-process tests (collectives, sync steps, distributed metrics) start a script once
per rank and wait for every one. Waiting rank by rank with ``communicate(timeout=)``
leaves the other ranks running when one hangs or dies early (its peers then wait out
their collective's timeout); :func:`run_ranks` waits for all of them against one
deadline, kills every rank still running when the deadline passes or when the test's
own code raises, and gives back each rank's exit code and output.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RankResult", "run_ranks"]


@dataclass(frozen=True)
class RankResult:
    rank: int
    returncode: int | None  # None: killed at the deadline
    output: str


def run_ranks(
    script: str | Path,
    world: int,
    argv: Callable[[int], Sequence[str]],
    *,
    timeout_s: float = 180.0,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    rank0_last: bool = False,
) -> list[RankResult]:
    """Start ``python SCRIPT *argv(rank)`` for every rank in ``0..world-1``, wait for all.

    Args:
        argv: the arguments of each rank's command line after the script.
        timeout_s: one deadline for the whole group; ranks still running then are killed.
        env: the ranks' environment (default: this process's).
        check: raise AssertionError, with every rank's output, unless all exit 0.
        rank0_last: start the ranks in reverse order (rank 0, which hosts the rendezvous
            store, last: the others must wait for it).
    """
    procs: dict[int, subprocess.Popen[str]] = {}
    outputs: dict[int, str] = {}
    killed: set[int] = set()
    try:
        for rank in reversed(range(world)) if rank0_last else range(world):
            command = [sys.executable, str(script), *map(str, argv(rank))]
            procs[rank] = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=None if env is None else dict(env),
            )
        deadline = time.monotonic() + timeout_s
        for rank, proc in sorted(procs.items()):
            try:
                outputs[rank] = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                break
    finally:
        for rank, proc in sorted(procs.items()):  # the late and, when this raised, every one
            if proc.poll() is None:
                proc.kill()
                killed.add(rank)
        for rank, proc in sorted(procs.items()):
            if rank not in outputs:
                outputs[rank] = proc.communicate()[0]
    note = f"\n[killed at the {timeout_s} s deadline]"
    results = [
        RankResult(rank, None if rank in killed else proc.returncode,
                   outputs[rank] + (note if rank in killed else ""))
        for rank, proc in sorted(procs.items())
    ]  # fmt: skip
    if check and any(r.returncode != 0 for r in results):
        raise AssertionError(
            "\n".join(f"--- rank {r.rank}: exit {r.returncode}\n{r.output}" for r in results)
        )
    return results
