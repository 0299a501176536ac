"""The background server of local mode (a script run with plain ``python script.py``).

``sps.init()`` with no SPARSEPS_* variable starts one ``python -m sparseps.server`` on a
free loopback port, waits until it answers a ping, and stops it in ``sps.stop()`` or at
exit. The server runs in its own session (Ctrl-C in the terminal reaches only the
script, which then stops the server cleanly) and on Linux gets SIGTERM if the script
dies, even by SIGKILL: no orphan server survives. With ``SPARSEPS_ZYGOTE_DIR`` naming a
folder where a zygote of this environment is up (:mod:`sparseps.launch.zygote`), the
server is forked, already imported, instead: the same guarantees, ~1.5 CPU-s less.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..env import SERVER_START_TIMEOUT, ZYGOTE_DIR, child_environ
from ..errors import DeadlineError, SparsePSError, UnavailableError
from ..launch.fork_server import ForkedProcess, ForkServer, fork_server_enabled
from ..launch.procutil import die_with_parent_hook, stop_groups, tail
from ..launch.spec import free_ports

__all__ = ["LocalServer"]

log = logging.getLogger(__name__)


class LocalServer:
    """One server process on ``127.0.0.1`` for local mode; a context manager.

    Args:
        start_timeout_s: how long :meth:`start` waits for the server to answer.
        host: loopback address to serve on.
    """

    def __init__(self, *, start_timeout_s: float = 60.0, host: str = "127.0.0.1") -> None:
        self.start_timeout_s = start_timeout_s
        self.host = host
        self.endpoint = ""
        self.log_dir = Path()
        self._proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self._fork_server: ForkServer | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_path(self) -> Path:
        return self.log_dir / "server.0.log"

    def start(self) -> str:
        """Start the server and wait until it answers a ping; returns its endpoint.

        Raises:
            UnavailableError: the server process exited during start-up (its log tail
                is in the message).
            DeadlineError: it did not answer within ``start_timeout_s``.
        """
        if self._proc is not None:
            return self.endpoint
        self.endpoint = f"{self.host}:{free_ports(self.host, 1)[0]}"
        self.log_dir = Path(tempfile.mkdtemp(prefix="sparseps-local-"))
        argv = [
            sys.executable,
            "-m",
            "sparseps.server",
            "--rank",
            "0",
            "--endpoints",
            self.endpoint,
        ]
        env = child_environ({"PYTHONUNBUFFERED": "1"})
        with open(self.log_path, "wb") as logfile:
            proc = self._proc = self._forked(
                argv[2], argv[3:], env, logfile.fileno()
            ) or subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),
            )
        try:
            self._wait_ready(proc)
        except BaseException:
            self.close(keep_log=True)
            raise
        log.info(
            "local mode: no SPARSEPS_* variable is set, so this script is worker 0 of 1 with "
            "one background server (pid %d, %s, log %s)",
            proc.pid,
            self.endpoint,
            self.log_path,
        )
        return self.endpoint

    def _forked(
        self, module: str, args: list[str], env: dict[str, str], logfile: int
    ) -> ForkedProcess | None:
        """The server forked by a fork server a zygote forked for this process (it exits
        with this process, and the server with it), where ``SPARSEPS_ZYGOTE_DIR`` has one
        up for this environment; None: start it as a fresh interpreter."""
        if not fork_server_enabled(env) or ZYGOTE_DIR not in env:
            return None
        forks = ForkServer(env, fresh=False)
        proc = forks.spawn_module(module, args, env, stdout=logfile, stderr=logfile)
        if proc is None:
            forks.close()
        else:
            self._fork_server = forks
        return proc

    def _wait_ready(self, proc: subprocess.Popen[bytes] | ForkedProcess) -> None:
        from ..rpc.client import PSClient

        deadline = time.monotonic() + self.start_timeout_s
        host, port = self.endpoint.rsplit(":", 1)
        while True:
            code = proc.poll()
            if code is not None:
                lines = "\n".join(tail(self.log_path, 20))
                raise UnavailableError(
                    f"local mode: the background server exited with code {code} during "
                    f"start-up; its log {self.log_path} ends with:\n{lines}",
                    op="start",
                    role="server",
                    rank=0,
                    address=self.endpoint,
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineError(
                    f"local mode: the background server at {self.endpoint} did not answer "
                    f"within {self.start_timeout_s:.0f} s (log {self.log_path}); raise "
                    f"{SERVER_START_TIMEOUT}",
                    op="start",
                    role="server",
                    rank=0,
                    address=self.endpoint,
                    seconds=self.start_timeout_s,
                    setting=SERVER_START_TIMEOUT,
                )
            try:  # a TCP connect first: cheap, and the client is only built once it can work
                socket.create_connection((host, int(port)), timeout=min(1.0, left)).close()
            except OSError:
                time.sleep(0.05)
                continue
            try:
                with PSClient([self.endpoint], timeout=min(5.0, max(left, 0.5))) as client:
                    client.ping()
                return
            except SparsePSError:
                time.sleep(0.1)

    def close(self, *, grace_s: float = 5.0, keep_log: bool = False) -> None:
        """Ask the server to stop, then SIGTERM/SIGKILL; removes its log folder unless kept."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                from ..rpc.client import PSClient

                with PSClient([self.endpoint], timeout=grace_s) as client:
                    client.stop_servers()
                proc.wait(timeout=grace_s)
            except Exception as exc:  # stop_groups below is the fallback
                log.debug("local server stop request failed: %s", exc)
        stop_groups([proc], grace_s)
        if proc.returncode not in (0, None) and proc.returncode != -15:
            keep_log = True
            log.warning(
                "local server exited with code %s; log kept at %s", proc.returncode, self.log_path
            )
        if self._fork_server is not None:
            self._fork_server.close()
            self._fork_server = None
        if not keep_log:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
