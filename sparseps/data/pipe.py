"""``pipe_command``: a shell command turns a raw file into a parseable text format.

The command runs once per file with ``sh -c``, the file on its stdin; its stdout is
parsed (by default as the slot text format). Example, Avazu CSV to slot text with awk::

    tail -n +2 | awk -F, '{printf "click:%s", $2; for (i = 3; i <= NF; i++)
                           printf " %d:%d", i - 2, strtonum("0x" substr($i, 1, 8)) ; print ""}'

A command that exits non-zero fails the read with an error naming the command, the file,
the exit code and the end of its stderr; one that prints nothing for ``timeout`` seconds
is killed and fails the same way.

A bare ``python`` or ``python3`` in the command is this process's interpreter
(``sys.executable``), wherever it stands in the script (``python reader.py``,
``zcat | python3 reader.py``): the command runs after two shell functions of those names,
so a job started through the full path of a virtual environment's ``bin/sparseps``, with
that environment not on ``PATH``, runs its Paddle-style ``pipe_command="python reader.py"``
with the interpreter that has sparseps. A path (``/usr/bin/python3``), another name
(``python3.12``) or a command that bypasses shell functions (``exec python``,
``env python``, ``xargs python``) is looked up on ``PATH`` as usual.

The command runs in a session of its own, so its process group holds the shell *and*
every process of a pipeline (``a | b | c``) or anything they start. On a timeout, an
error, or a reader that stops early (the generator closed), the whole group gets SIGTERM,
then SIGKILL after :data:`KILL_GRACE_S`: killing only the shell would leave the pipeline's
processes running, each holding its input file and memory.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator

from ..errors import ConfigError, DeadlineError, InputError

__all__ = ["check_pipe_timeout", "pipe_chunks", "shell_script"]

READ_BYTES = 1 << 22
STDERR_TAIL = 2000
KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL to the command's process group


def check_pipe_timeout(timeout: float) -> float:
    """``timeout`` in seconds: a finite number > 0 (``inf`` would wait forever).

    Raises:
        ConfigError: naming ``pipe_timeout`` and the value.
    """
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigError(f"pipe_timeout: expected a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


def shell_script(command: str, interpreter: str | None = None) -> str:
    """The script ``sh -c`` runs for ``command``: ``python`` and ``python3`` defined as
    shell functions running ``interpreter`` (default ``sys.executable``), then the command.

    Example::

        >>> print(shell_script("python reader.py", "/opt/venv/bin/python"))
        python() { /opt/venv/bin/python "$@"; }; python3() { /opt/venv/bin/python "$@"; }
        python reader.py
    """
    exe = sys.executable if interpreter is None else interpreter
    if not exe:  # an embedded interpreter may not know its own path: PATH decides
        return command
    run = f'{{ {shlex.quote(exe)} "$@"; }}'
    return f"python() {run}; python3() {run}\n{command}"


def pipe_chunks(command: str, path: str, *, timeout: float) -> Generator[bytes, None, None]:
    """Run ``command`` with ``path`` on stdin; yield its stdout in pieces.

    A bare ``python``/``python3`` in ``command`` runs ``sys.executable`` (:func:`shell_script`).

    Raises:
        ConfigError: ``timeout`` is not a finite number > 0.
        InputError: the command exited non-zero (after its whole output was yielded).
        DeadlineError: no output for ``timeout`` seconds, or the command kept running
            ``timeout`` seconds after closing its output.
    """
    timeout = check_pipe_timeout(timeout)
    with open(path, "rb") as stdin, tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", shell_script(command)], stdin=stdin, stdout=subprocess.PIPE, stderr=stderr,
            start_new_session=True,  # its own process group: the whole pipeline
        )  # fmt: skip
        stdout = proc.stdout
        assert stdout is not None  # stdout=PIPE
        done = False
        try:
            fd = stdout.fileno()
            while True:
                start = time.monotonic()
                ready, _, _ = select.select([fd], [], [], timeout)
                if not ready:
                    raise _timeout(
                        command, path, timeout, time.monotonic() - start, "printed nothing"
                    )
                piece = os.read(fd, READ_BYTES)
                if not piece:
                    break
                yield piece
            start = time.monotonic()
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise _timeout(
                    command, path, timeout, time.monotonic() - start, "closed its output but kept running"
                ) from None  # fmt: skip
            done = True
            if code != 0:
                stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - STDERR_TAIL))
                tail = stderr.read().decode("utf-8", "replace").strip()
                raise InputError(
                    f"pipe_command {command!r} failed on {path} with exit code {code}"
                    + (f"; stderr: {tail}" if tail else "")
                )
        finally:
            stdout.close()
            _stop_group(proc, graceful=not done)


def _timeout(command: str, path: str, timeout: float, waited: float, what: str) -> DeadlineError:
    return DeadlineError(
        f"pipe_command {command!r} {what} for {timeout:g} s on {path}; "
        "raise pipe_timeout= if the command is slow",
        op="pipe_command", role="pipe", address=path, seconds=waited, setting="pipe_timeout",
    )  # fmt: skip


def _stop_group(proc: subprocess.Popen, *, graceful: bool) -> None:
    """Stop every process of the command's group (the shell leads it; pgid = its pid).

    Args:
        graceful: SIGTERM first and wait up to :data:`KILL_GRACE_S` for the shell (the
            command was cut short); otherwise it exited by itself and any process it left
            in its group is killed outright.
    """
    if graceful:
        _killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)
    _killpg(proc.pid, signal.SIGKILL)  # stragglers: a pipeline member that ignored SIGTERM
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(pgid, sig)
