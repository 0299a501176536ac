"""PaddleRec's MultiSlot readers run unchanged but for their import line, and print exactly
what they print under Paddle (issue 58).

Nine of PaddleRec's readers are kept as published under tests/fixtures/paddlerec/upstream
(the six that ``yield zip(...)`` among them; README.md there). Each is run as PaddleRec's
trainer runs it (``python reader.py CONFIG UTILS_DIR``, a small input on stdin):

- under sparseps, its import line changed to ``import sparseps.data as fleet``: its stdout
  must be the bytes Paddle 2.6.2's own generator printed for it, kept in
  tests/fixtures/paddlerec/expected (``tests/data/paddle_peer.py --write-expected``
  writes them), so CI checks the bytes without Paddle;
- under Paddle 2.6.2 too, where its environment exists (``$PADDLE_VENV``, default
  /tmp/paddle-2.6.2-venv; skipped with the reason where it does not): the two runs print
  the same bytes, and those are the kept ones.
"""

from __future__ import annotations

import difflib
import functools
import subprocess
import sys
from pathlib import Path

import pytest
from paddle_peer import ROOT, clean_env, git_blob_id, paddle_missing, paddle_python, stdout_of
from paddlerec_readers import (  # the test folder is on sys.path
    FIXTURES,
    PADDLE_IMPORT,
    READERS,
    SPARSEPS_IMPORT,
    SUPPORT_FILES,
    UPSTREAM,
    Reader,
    port,
    run_reader,
)

pytestmark = pytest.mark.timeout(240)

IDS = [reader.name for reader in READERS]


@functools.cache
def _paddle_missing() -> str | None:
    return paddle_missing()


def test_the_kept_readers_are_paddlerecs_files_byte_for_byte():
    for reader in READERS:
        assert git_blob_id((UPSTREAM / reader.path).read_bytes()) == reader.blob, reader.path
    for path, blob in SUPPORT_FILES.items():
        assert git_blob_id((FIXTURES / path).read_bytes()) == blob, path


def test_six_or_more_readers_and_every_zip_one_among_them():
    zips = [r for r in READERS if r.yields == "zip"]
    for reader in READERS:
        text = (UPSTREAM / reader.path).read_text()
        assert ("yield zip(" in text) == (reader.yields == "zip"), reader.path
    assert len(READERS) >= 6 and len(zips) == 6


@pytest.mark.parametrize("reader", READERS, ids=IDS)
def test_a_paddlerec_reader_prints_under_sparseps_what_it_printed_under_paddle(
    reader: Reader, tmp_path
):
    ours = stdout_of(run_reader(sys.executable, port(reader, tmp_path), reader), "sparseps")
    assert ours, reader.path
    assert ours == reader.expected.read_bytes()


@pytest.mark.parametrize("reader", READERS, ids=IDS)
def test_a_paddlerec_reader_prints_the_same_bytes_under_paddle_and_sparseps(
    reader: Reader, tmp_path
):
    missing = _paddle_missing()
    if missing:
        pytest.skip(f"Paddle's side not run: {missing} (the kept bytes are checked above)")
    theirs = stdout_of(run_reader(paddle_python(), UPSTREAM / reader.path, reader), "Paddle")
    ours = stdout_of(run_reader(sys.executable, port(reader, tmp_path), reader), "sparseps")
    assert ours == theirs
    assert theirs == reader.expected.read_bytes(), "rewrite the kept bytes (--write-expected)"


def test_the_paddle_port_example_reader_is_paddlerecs_with_its_marked_changes(tmp_path):
    # examples/paddle_port/reader.py: PaddleRec's models/rank/dnn/queuedataset_reader.py
    # (the same bytes as wide_deep's, kept here) with the changes listed at its top, each
    # line marked "sparseps:"; it prints what PaddleRec's reader prints under Paddle
    (upstream,) = [r for r in READERS if r.path == "models/rank/wide_deep/queuedataset_reader.py"]
    ported = (ROOT / "examples" / "paddle_port" / "reader.py").read_text().splitlines()
    diff = list(difflib.ndiff((UPSTREAM / upstream.path).read_text().splitlines(), ported))
    removed = [line[2:] for line in diff if line.startswith("- ")]
    added = [line[2:] for line in diff if line.startswith("+ ")]
    assert removed[0] == "import six" and removed[1] == PADDLE_IMPORT.strip()
    assert [line.strip() for line in removed[2:]] == [
        "yaml_path = sys.argv[1]", "utils_path = sys.argv[2]", "sys.path.append(utils_path)",
        "import common_ps", "yaml_helper = common_ps.YamlHelper()",
        "config = yaml_helper.load_yaml(yaml_path)",
    ]  # fmt: skip
    code = [line.strip() for line in added if not line.lstrip().startswith("#")]
    assert code == [SPARSEPS_IMPORT.strip(), "config = None"]
    assert sum(line.lstrip().startswith("# sparseps:") for line in added) == 3
    with open(upstream.input_path, "rb") as stdin:
        done = subprocess.run(
            ["python", str(ROOT / "examples" / "paddle_port" / "reader.py")], stdin=stdin,
            capture_output=True, env=clean_env(PYTHONPATH=str(ROOT),
                                               PATH=f"{Path(sys.executable).parent}:/bin"),
        )  # fmt: skip
    assert stdout_of(done, "examples/paddle_port/reader.py") == upstream.expected.read_bytes()
