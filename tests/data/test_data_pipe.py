"""A ``pipe_command`` that times out, fails or is abandoned leaves no process behind: the
shell *and* every process of its pipeline are stopped (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from sparseps.data.pipe import KILL_GRACE_S, pipe_chunks
from sparseps.data.schema import CRITEO
from sparseps.data.sources import CHUNK_BYTES, Format, read_file
from sparseps.errors import ConfigError, DeadlineError, InputError
from sparseps.testing import wait_until

pytestmark = pytest.mark.timeout(60)


def _alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie only waits to be reaped: gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _member(pidfile: Path, *, ignore_term: bool = False) -> str:
    """A pipeline member that records its pid, then sleeps (as ``sleep`` itself, via exec)."""
    trap = "trap '' TERM; " if ignore_term else ""
    return f"sh -c '{trap}echo $$ > {pidfile}; exec sleep 1000'"


def _pids(*files: Path, within: float = 10.0) -> list[int]:
    started = lambda: all(f.is_file() and f.read_text().strip() for f in files)  # noqa: E731
    wait_until(started, within, "the pipeline's members to start")
    return [int(f.read_text()) for f in files]


def _all_gone(pids: list[int], within: float) -> None:
    wait_until(lambda: not any(_alive(p) for p in pids), within, f"pipeline members {pids} to exit")


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("1\t2\n")
    return path


def test_a_timeout_kills_every_process_of_the_pipeline(tmp_path, data):
    a, b, c = tmp_path / "a.pid", tmp_path / "b.pid", tmp_path / "c.pid"
    # the middle member ignores SIGTERM: only the SIGKILL that follows stops it
    command = f"cat | {_member(a)} | {_member(b, ignore_term=True)} | {_member(c)}"
    start = time.monotonic()
    with pytest.raises(DeadlineError) as err:
        list(pipe_chunks(command, str(data), timeout=1.5))
    assert err.value.setting == "pipe_timeout" and err.value.op == "pipe_command"
    assert time.monotonic() - start < 1.5 + KILL_GRACE_S + 5
    _all_gone(_pids(a, b, c), within=5.0)


def test_a_reader_that_stops_early_stops_the_pipeline(tmp_path, data):
    a = tmp_path / "a.pid"
    pieces = pipe_chunks(f"cat; {_member(a)} | cat", str(data), timeout=30)
    assert next(pieces) == b"1\t2\n"
    pids = _pids(a)
    assert _alive(pids[0])
    pieces.close()
    _all_gone(pids, within=KILL_GRACE_S + 5)


def test_a_parse_error_stops_the_pipeline_of_that_file(tmp_path, data):
    a = tmp_path / "a.pid"
    # a CSV header without the schema's columns fails the read once a chunk of text is in
    # (CHUNK_BYTES); the command goes on
    command = (
        f"{_member(a)} </dev/null >/dev/null 2>&1 & while [ ! -s {a} ]; do :; done; "
        f"echo wrong,header; yes 1,2 | head -c {CHUNK_BYTES + 1000}; wait"
    )
    rows = read_file(str(data), 0, CRITEO, Format.CSV, pipe_command=command, pipe_timeout=30)
    started = time.monotonic()
    with pytest.raises((InputError, DeadlineError)) as err:
        next(rows)
    pids = _pids(a)
    assert isinstance(err.value, InputError), err.value  # not the 30 s timeout
    assert time.monotonic() - started < 20
    _all_gone(pids, within=KILL_GRACE_S + 5)


def test_a_failing_command_leaves_nothing_in_its_group(tmp_path, data):
    a = tmp_path / "a.pid"
    # the shell exits 3 at once; a member it started in the background would linger
    command = f"{_member(a)} </dev/null >/dev/null 2>&1 & while [ ! -s {a} ]; do :; done; exit 3"
    with pytest.raises(InputError, match="exit code 3"):
        list(pipe_chunks(command, str(data), timeout=30))
    _all_gone(_pids(a), within=5.0)


@pytest.mark.parametrize("timeout", [math.inf, math.nan, -math.inf, 0, -1, "5", True])
def test_timeouts_that_are_not_finite_seconds_are_rejected(data, timeout):
    with pytest.raises(ConfigError, match="pipe_timeout"):
        next(pipe_chunks("cat", str(data), timeout=timeout))
