"""``pipe_command``: a shell command turns a raw file into a parseable text format.

The command runs once per file with ``sh -c``, the file on its stdin; its stdout is
parsed (by default as the slot text format). Example, Avazu CSV to slot text with awk::

    tail -n +2 | awk -F, '{printf "click:%s", $2; for (i = 3; i <= NF; i++)
                           printf " %d:%d", i - 2, strtonum("0x" substr($i, 1, 8)) ; print ""}'

A command that exits non-zero fails the read with an error naming the command, the file,
the exit code and the end of its stderr; one that prints nothing for ``timeout`` seconds
is killed and fails the same way.
"""

from __future__ import annotations

import os
import select
import subprocess
import tempfile
import time
from collections.abc import Iterator

from ..errors import InputError, TimeoutError_

__all__ = ["pipe_chunks"]

READ_BYTES = 1 << 22
STDERR_TAIL = 2000


def pipe_chunks(command: str, path: str, *, timeout: float) -> Iterator[bytes]:
    """Run ``command`` with ``path`` on stdin; yield its stdout in pieces.

    Raises:
        InputError: the command exited non-zero (after its whole output was yielded).
        TimeoutError_: no output for ``timeout`` seconds.
    """
    with open(path, "rb") as stdin, tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=stdin, stdout=subprocess.PIPE, stderr=stderr
        )
        try:
            fd = proc.stdout.fileno()
            while True:
                start = time.monotonic()
                ready, _, _ = select.select([fd], [], [], timeout)
                if not ready:
                    raise TimeoutError_(
                        f"pipe_command {command!r} printed nothing for {timeout:.0f} s on {path}; "
                        "raise pipe_timeout= if the command is slow",
                        op="pipe_command", role="pipe", address=path,
                        seconds=time.monotonic() - start, setting="pipe_timeout",
                    )  # fmt: skip
                piece = os.read(fd, READ_BYTES)
                if not piece:
                    break
                yield piece
            code = proc.wait(timeout=timeout)
            if code != 0:
                stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - STDERR_TAIL))
                tail = stderr.read().decode("utf-8", "replace").strip()
                raise InputError(
                    f"pipe_command {command!r} failed on {path} with exit code {code}"
                    + (f"; stderr: {tail}" if tail else "")
                )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            proc.stdout.close()
