"""``ServeProcess``: ``sparseps serve`` in a child process, for tests, benchmarks, examples.

    with ServeProcess("out/infer", poll_s=0.2) as service:
        httpx.post(service.url + "/predict", json={"rows": [...]})

It starts ``python -m sparseps.cli serve DIR --port 0 --ready-file F``, waits (bounded)
for the ready file, and on exit stops the child by its pid (SIGTERM, then SIGKILL after
``stop_timeout``). The child's output goes to ``log_path`` (default: a file next to the
ready file), named in every error. Closing removes the working folder it made (the ready
file and a default log; :meth:`ServeProcess.log` still returns that log's text).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import DeadlineError, UnavailableError

__all__ = ["ServeProcess"]


def _data_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child, before it executes python
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    return apply


class ServeProcess:
    """A served model directory in a child process (see the module docstring).

    Args:
        model_dir: the inference model folder.
        poll_s: the service's poll interval.
        start_timeout: seconds to wait for it to listen.
        extra_args: more ``sparseps serve`` arguments (``["--max-rows", "10"]``).
        log_path: where the child's stdout and stderr go.
        workers: service processes (``--workers``; 1 by default here, so that
            :attr:`pid` is the process that answers; 0: one per core).
        data_limit_bytes: the child's ``RLIMIT_DATA`` (None: none). It bounds the heap
            (private writable memory: malloc, numpy and torch arrays, thread stacks)
            and not file maps read-only, which is where the model's rows are
            (:mod:`sparseps.checkpoint.mapped_table`); ``RLIMIT_AS`` would count those
            maps and the libraries' address-space reservations too.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        poll_s: float = 1.0,
        start_timeout: float = 120.0,
        stop_timeout: float = 15.0,
        extra_args: list[str] | None = None,
        log_path: str | Path | None = None,
        workers: int = 1,
        data_limit_bytes: int | None = None,
    ) -> None:
        self._work = Path(tempfile.mkdtemp(prefix="sparseps-serve-"))
        self._closed_log: str | None = None  # a default log's text, once its folder is gone
        self.ready_file = self._work / "ready.json"
        self.log_path = Path(log_path) if log_path else self._work / "serve.log"
        self.stop_timeout = stop_timeout
        argv = [
            sys.executable, "-m", "sparseps.cli", "serve", str(model_dir),
            "--host", "127.0.0.1", "--port", "0", "--poll-s", str(poll_s),
            "--ready-file", str(self.ready_file), "--workers", str(workers),
            *(extra_args or []),
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the fd
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=None if data_limit_bytes is None else _data_limit(data_limit_bytes),
            )
        try:
            self.url = self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_file.is_file():
                return str(json.loads(self.ready_file.read_text())["url"])
            if self.process.poll() is not None:
                raise UnavailableError(
                    f"sparseps serve exited with code {self.process.returncode} before "
                    f"listening; its log {self.log_path}:\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)
        raise DeadlineError(
            f"sparseps serve (pid {self.pid}) did not listen within {timeout} s "
            f"(start_timeout); its log: {self.log_path}"
        )

    def log(self) -> str:
        if self._closed_log is not None:
            return self._closed_log
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def close(self) -> int | None:
        """Stop the child (SIGTERM, then SIGKILL); returns its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(self.stop_timeout)
        if self._work.exists():  # the child is gone: nothing writes here any more
            if self.log_path.parent == self._work:
                self._closed_log = self.log()
            shutil.rmtree(self._work, ignore_errors=True)
        return self.process.returncode

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten close must not leave a server running
        if getattr(self, "process", None) is not None and self.process.poll() is None:
            os.kill(self.process.pid, 15)
