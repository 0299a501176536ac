"""A damaged ``ledger.jsonl`` (issue 52): ``sparseps online`` stops before it starts
anything, with one ``sparseps online: error:`` line naming the file, the line and what is
wrong with it, and ``status.json`` says ``failed`` with that error, never an earlier run's.

Every kind of damage is a ``sparseps online`` run on a model directory whose ledger holds
two good pass records and one damaged line: the command's entry point
(``sparseps.cli.main``), called in this process for most kinds (the command reads the
ledger under the folder's lock before it launches anything, so a process of its own would
only add its interpreter's start: about 0.7 s of CPU a kind, most of this module's time),
and in a process of its own for one damaged and the unreadable ledger (the exit code and
stderr as a shell sees them). A job that fails inside
worker 0 for a reason of its own (a broken model builder, launched for real) replaces an
earlier run's error in ``status.json`` too; a damaged ledger seen by worker 0 itself (a
job started without the command) stops its driver before it trains.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from _fakes import FakeDriver, FakeTrainer, fake_config
from _onlinetools import BUILDERS, clean_env, online_argv, run_online, write_config

from sparseps import cli
from sparseps.online import Ledger, LedgerError

pytestmark = pytest.mark.timeout(300)

PREFIX = "sparseps online: error: "
STALE = {
    "state": "failed",
    "error": "an earlier run's error (stale)",
    "time": "2024-01-01T00:00:00",
}
_DROP = object()


def _pass(number: int, /, **changes) -> dict:
    """Pass record ``number`` as the driver writes it (``_DROP``: leave a field out)."""
    record = {
        "kind": "pass", "seq": number, "day": "20240101", "pass": number,
        "splits": [f"/data/20240101/{5 * number:04d}"], "eval": {"auc": 0.61, "count": 400},
        "train": {"auc": 0.63, "count": 400}, "saved": {}, "checkpoint": None,
        "trained": True, "samples": 400, "passes": number + 1,
    }  # fmt: skip
    record.update(changes)
    return {k: v for k, v in record.items() if v is not _DROP}


def _line(record) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


GOOD = [_line(_pass(0)), _line(_pass(1))]

# name: (the ledger's lines, the damaged line's number, what the message says of it)
CASES = {
    "issue_52_pass_without_fields": ([*GOOD, b'{"kind": "pass"}'], 3, 'needs "seq"'),
    "truncated_line_then_more": ([GOOD[0], GOOD[1][:40], _line(_pass(2))], 2, "not a JSON line"),
    "not_json": ([*GOOD, b"hello, ledger"], 3, "not a JSON line"),
    "zero_filled": ([*GOOD, b"\0" * 32], 3, "not a JSON line"),
    "not_utf8": ([*GOOD, b'{"kind": "pass", "day": "\xff\xfe"}'], 3, "not UTF-8"),
    "array": ([*GOOD, b"[2, 3]"], 3, "a JSON array, not an object"),
    "null": ([*GOOD, b"null"], 3, "a JSON null, not an object"),
    "nested_too_deeply": ([*GOOD, b"[" * 100_000], 3, "nested too deeply"),
    "no_kind": ([*GOOD, b'{"seq": 2}'], 3, 'no "kind"'),
    "unknown_kind": ([*GOOD, _line({**_pass(2), "kind": "restart"})], 3, '"kind" must be'),
    "duplicate_key": ([*GOOD, _line(_pass(2))[:-1] + b', "seq": 7}'], 3, "'seq' appears twice"),
    "missing_seq": ([*GOOD, _line(_pass(2, seq=_DROP))], 3, 'needs "seq"'),
    "missing_eval": ([*GOOD, _line(_pass(2, eval=_DROP))], 3, 'needs "eval"'),
    "seq_a_string": ([*GOOD, _line(_pass(2, seq="2"))], 3, '"seq" of a pass record must'),
    "seq_a_boolean": ([*GOOD, _line(_pass(2, seq=True))], 3, '"seq" of a pass record must'),
    "seq_a_fraction": ([*GOOD, _line(_pass(2, seq=2.5))], 3, '"seq" of a pass record must'),
    "seq_negative": ([*GOOD, _line(_pass(2, seq=-2))], 3, '"seq" of a pass record must'),
    "day_malformed": ([*GOOD, _line(_pass(2, day="2024-01-01"))], 3, '"day"'),
    "pass_a_string": ([*GOOD, _line(_pass(2, **{"pass": "2"}))], 3, '"pass"'),
    "splits_not_a_list": ([*GOOD, _line(_pass(2, splits="/data"))], 3, '"splits"'),
    "eval_not_an_object": ([*GOOD, _line(_pass(2, eval=[0.6]))], 3, '"eval"'),
    "train_not_an_object": ([*GOOD, _line(_pass(2, train=0.6))], 3, '"train"'),
    "checkpoint_not_a_path": ([*GOOD, _line(_pass(2, checkpoint=3))], 3, '"checkpoint"'),
    "seq_repeated": ([*GOOD, _line(_pass(1))], 3, "seq 1 out of order"),
    "seq_skipped": ([*GOOD, _line(_pass(3))], 3, "seq 3 out of order"),
    "seq_backwards": ([*GOOD, _line(_pass(0))], 3, "seq 0 out of order"),
    "resume_ahead": (
        [*GOOD, _line({"kind": "resume", "seq": 4, "checkpoint": None})],
        3,
        "resume record seq 4",
    ),
    "resume_without_checkpoint": (
        [*GOOD, _line({"kind": "resume", "seq": 1})],
        3,
        'needs "checkpoint"',
    ),
    "pass_out_of_order_after_resume": (
        [*GOOD, _line({"kind": "resume", "seq": 0, "checkpoint": "/c/0"}), _line(_pass(2))],
        4,
        "seq 2 out of order",
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """A config over an empty stream (the command stops before it reads any)."""
    root = tmp_path_factory.mktemp("ledger")
    (root / "data").mkdir()
    return write_config(root / "job.yaml", data_root=root / "data", model_dir=root / "model",
                        days=1, passes_per_day=4, job={"worker_num": 1})  # fmt: skip


def _model_dir(job: Path) -> Path:
    return job.parent / "model"


# the kind whose command runs in a process of its own (the others call its entry point)
IN_A_PROCESS = "issue_52_pass_without_fields"
assert IN_A_PROCESS in CASES


def _run_in_this_process(job: Path) -> subprocess.CompletedProcess:
    """``sparseps.cli.main(["online", job])`` here, in the environment ``run_online`` gives
    its process (no SPARSEPS_* variable of this one): its exit code and what it printed."""
    argv = online_argv(job)[3:]  # [python, -m, sparseps.cli, online, CONFIG]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for name in [k for k in os.environ if k not in clean_env()]:
            patch.delenv(name)
        patch.chdir(job.parent)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _run_damaged(
    job: Path, content: bytes | None, *, in_a_process: bool
) -> tuple[subprocess.CompletedProcess, bytes]:
    """``sparseps online`` on a model directory that failed before (its status.json holds
    that run's error) and whose ledger is ``content`` (None: a folder in its place); in a
    process of its own or through its entry point in this one."""
    model = _model_dir(job)
    if model.exists():
        subprocess.run(["rm", "-rf", str(model)], check=True)
    model.mkdir()
    (model / "status.json").write_text(json.dumps(STALE))
    ledger = model / "ledger.jsonl"
    if content is None:
        ledger.mkdir()
    else:
        ledger.write_bytes(content)
    result = run_online(job, timeout=120) if in_a_process else _run_in_this_process(job)
    return result, content or b""


def _the_error(result: subprocess.CompletedProcess) -> str:
    """The one error line the command printed (without its prefix)."""
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0].removeprefix(PREFIX)


def _status(job: Path) -> dict:
    return json.loads((_model_dir(job) / "status.json").read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_ledger_stops_the_job_with_one_line_naming_file_and_line(job, case):
    lines, number, what = CASES[case]
    result, content = _run_damaged(
        job, b"\n".join(lines) + b"\n", in_a_process=case == IN_A_PROCESS
    )
    error = _the_error(result)
    print(f"\n{case}: {error}")
    ledger = _model_dir(job) / "ledger.jsonl"
    assert error.startswith(f"{ledger}:{number}: "), error
    assert what in error and "the ledger is damaged" in error
    status = _status(job)
    assert status["state"] == "failed" and status["error"] == error  # this run's, not STALE's
    assert ledger.read_bytes() == content  # nothing appended or cut
    assert not (_model_dir(job) / "log").exists()  # nothing was launched


def test_a_ledger_that_cannot_be_read_names_the_file(job):
    result, _ = _run_damaged(job, None, in_a_process=True)
    error = _the_error(result)
    ledger = _model_dir(job) / "ledger.jsonl"
    assert error.startswith(f"{ledger}: cannot read the ledger"), error
    assert _status(job)["state"] == "failed" and _status(job)["error"] == error


def test_worker_0_stops_its_driver_on_a_damaged_ledger_before_training(tmp_path):
    """A job started without ``sparseps online`` (its own script, ``sparseps launch``):
    worker 0's driver reads the ledger first and stops with the same error."""
    config = fake_config(tmp_path, days=1, passes_per_day=3)
    config.model_dir.mkdir(parents=True)
    ledger = Ledger.of(config.model_dir)
    ledger.path.write_bytes(b"\n".join([*GOOD, b'{"kind": "pass"}']) + b"\n")
    trainer = FakeTrainer()
    with pytest.raises(LedgerError, match=rf'{ledger.path}:3: a pass record needs "seq"'):
        FakeDriver(config, trainer).run()
    assert trainer.calls == []  # nothing evaluated, trained or saved


def test_a_failure_inside_worker_0_replaces_an_earlier_runs_error(tmp_path):
    """A launched job whose model builder raises (a bug, not a user error): worker 0 records
    it in status.json and the command prints it, not the error an earlier run left."""
    config = write_config(tmp_path / "job.yaml", data_root=tmp_path / "data",
                          model_dir=tmp_path / "model", days=1, passes_per_day=1,
                          job={"worker_num": 1}, model={"builder": f"{BUILDERS}:broken"})  # fmt: skip
    (tmp_path / "data").mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "status.json").write_text(json.dumps(STALE))
    result = subprocess.run(online_argv(config), env=clean_env(), capture_output=True, text=True,
                            timeout=240, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(lines) == 1, result.stderr[-3000:]
    error = lines[0].removeprefix(PREFIX)
    assert "RuntimeError" in error and "a test's broken builder" in error, error
    status = json.loads((tmp_path / "model" / "status.json").read_text())
    assert status["state"] == "failed" and status["error"] == error
