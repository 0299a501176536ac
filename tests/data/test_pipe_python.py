"""A bare ``python`` in a ``pipe_command`` is the job's own interpreter (issue 58).

Paddle's docs and PaddleRec's configs write ``pipe_command="python reader.py"``. A job
started through the full path of a virtual environment's ``bin/sparseps``, with that
environment not on ``PATH``, used to run whichever ``python`` came first on ``PATH``
(``No module named 'sparseps'``). Here ``PATH`` holds only a ``python`` and a ``python3``
that fail: the reader still runs, with ``sys.executable``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sparseps.data import QueueDataset, Schema
from sparseps.data.pipe import shell_script

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Schema("click", ("d", "d"), ("1",), dense_transform="raw")
READER = """\
import sparseps.data as fleet


class Reader(fleet.MultiSlotDataGenerator):
    def generate_sample(self, line):
        def reader():
            label, a, b, *ids = line.split()
            values = [[int(label)], [float(a), float(b)], [int(i) for i in ids] or [0]]
            yield zip(["click", "d", "1"], values)

        return reader


if __name__ == "__main__":
    Reader().run_from_stdin()
"""


def _fakes(folder: Path) -> Path:
    """A folder with a ``python`` and a ``python3`` that say so and exit 1."""
    folder.mkdir()
    for name in ("python", "python3"):
        fake = folder / name
        fake.write_text(f"#!/bin/sh\necho 'the {name} on PATH ran' >&2\nexit 1\n")
        fake.chmod(0o755)
    return folder


@pytest.mark.parametrize(
    "command",
    [
        "python {reader}",
        "python3 {reader}",
        "cat | python {reader} | python3 -c 'import sys; sys.stdout.write(sys.stdin.read())'",
    ],
)
def test_a_bare_python_is_the_jobs_interpreter_whatever_path_says(tmp_path, monkeypatch, command):
    reader = tmp_path / "my reader.py"  # a space: the path is quoted like any shell word
    reader.write_text(READER)
    data = tmp_path / "part-0.txt"
    data.write_text("1 0.5 0.25 7 8\n0 1.5 2.5\n")
    monkeypatch.setenv("PATH", f"{_fakes(tmp_path / 'bin')}:/bin")  # /bin: cat
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    command = command.format(reader=f"'{reader}'")
    (batch,) = QueueDataset(str(data), SCHEMA, 8, pipe_command=command, format="multislot")
    assert batch.label.tolist() == [1, 0]
    np.testing.assert_array_equal(batch.dense, [[0.5, 0.25], [1.5, 2.5]])
    assert batch.slots["1"].values.tolist() == [7, 8, 0]


def test_the_shell_script_defines_python_and_python3_as_the_interpreter(tmp_path):
    interpreter = tmp_path / "an 'odd' python"
    interpreter.write_text('#!/bin/sh\necho "ran with $*"\n')
    interpreter.chmod(0o755)
    script = shell_script("python a b; python3 c | cat; /bin/echo python", str(interpreter))
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PATH": "/bin:/usr/bin"}, check=True)  # fmt: skip
    assert done.stdout == "ran with a b\nran with c\npython\n"
    assert shell_script("python r.py", "").endswith("python r.py")  # no interpreter: PATH's
    assert shell_script("python r.py").startswith(f"python() {{ {sys.executable} ")


def test_a_generator_script_loads_the_generator_alone():
    # a pipe command runs once per file: `import sparseps.data as fleet` must not load
    # the compiled parsers (numba) that only the datasets need
    code = (
        "import sys, sparseps.data as fleet; fleet.MultiSlotDataGenerator; "
        "fleet.MultiSlotStringDataGenerator; print('numba' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
