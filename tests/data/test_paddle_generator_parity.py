"""sparseps' MultiSlotDataGenerator and MultiSlotStringDataGenerator print the bytes
Paddle's print, method by method (issue 58).

tests/data/jobs/paddle_generator_cases.py holds generator scripts as a Paddle user writes
them: samples yielded as zips, lists and tuples (and None, skipped), ints that become
floats, ``set_batch`` with a ``generate_batch`` that pads to the batch's longest,
the default batch of 32, ``run_from_stdin`` and ``run_from_memory``, the string class,
a script that prints to stdout itself between samples, and one that fails half-way
(what it printed before stays). Each prints under sparseps exactly the bytes Paddle
2.6.2 printed (kept in tests/fixtures/paddle_generator/expected), with the same exit
code; where Paddle's environment exists, each also runs under Paddle and the two match.
"""

from __future__ import annotations

import functools

import pytest
from generator_probe import CASES, expected, run_case  # the test folder is on sys.path
from paddle_peer import paddle_missing

pytestmark = pytest.mark.timeout(240)


@functools.cache
def _paddle_missing() -> str | None:
    return paddle_missing()


@pytest.mark.parametrize("case", CASES)
def test_a_generator_script_prints_what_it_printed_under_paddle(case):
    done = run_case(case, paddle=False)
    assert done.returncode == CASES[case], done.stderr.decode()[-3000:]
    assert done.stdout == expected(case).read_bytes()


@pytest.mark.parametrize("case", CASES)
def test_a_generator_script_prints_the_same_bytes_under_paddle_and_sparseps(case):
    missing = _paddle_missing()
    if missing:
        pytest.skip(f"Paddle's side not run: {missing} (the kept bytes are checked above)")
    theirs, ours = run_case(case, paddle=True), run_case(case, paddle=False)
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout)
    assert theirs.stdout == expected(case).read_bytes(), "rewrite the kept bytes (--write-expected)"
