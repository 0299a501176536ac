"""``local_cluster``: real server processes on loopback, for tests, benchmarks and tools.

Example::

    with local_cluster(servers=2) as cluster:
        with cluster.client() as client:
            client.create_table(TableConfig(name="emb", dim=8))
            rows = client.pull("emb", keys).wait()
        cluster.kill(1)          # SIGKILL, for fault tests

On exit every server gets a ``stop`` op, then SIGTERM, then SIGKILL after a grace
period, so no process outlives the block even when its body raised.

The servers are forked from one fork server per process (:mod:`sparseps.launch.fork_server`,
shared by every cluster of the process, started by the first), as the launcher's are: a
server costs a fork instead of an interpreter importing numpy, numba and zmq (about a
CPU-second; the test suite starts some 150). A process's environment may change (importing
ray sets a variable): a new environment gets its own fork server, up to four. A server is
a fresh interpreter instead when ``fork=False`` (a figure of its memory), when
``SPARSEPS_FORK_SERVER=0``, when its environment is a fifth, or when the cluster is
started from a thread other than the main thread (the fork server gets SIGTERM when the
thread that started it ends).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..env import process_environ
from ..errors import ConfigError, SparsePSError, UnavailableError
from ..launch.fork_server import ForkedProcess, ForkServer, fork_server_enabled
from ..rpc.client import PSClient
from ..rpc.security import Security, security_from_key_dir
from ..rpc.transport import free_port

__all__ = ["LocalCluster", "local_cluster"]

log = logging.getLogger(__name__)

_START_ATTEMPTS = 3
_GRACE_S = 5.0
_SERVER_MODULE = "sparseps.server"

Server = subprocess.Popen | ForkedProcess


class LocalCluster:
    """Handles to the server processes of a :func:`local_cluster`.

    Attributes:
        endpoints: ``127.0.0.1:port`` per server rank.
        processes: the ``subprocess.Popen`` (or forked equivalent) of each server.
        log_dir: folder holding ``server.R.log`` (each server's stderr).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        processes: list[Server],
        log_dir: Path,
        timeout: float,
        *,
        job_id: str | None = None,
        security: Security | None = None,
        replicas: int = 0,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.replicas = replicas
        self._options: list[str] = []  # the servers' command-line options (for replace)
        self._environ: dict | None = None
        self._fork = True
        self.processes = processes
        self.log_dir = log_dir
        self.timeout = timeout
        self.job_id = job_id
        self.security = security
        self._clients: list[PSClient] = []

    def client(self, *, timeout: float | None = None, **options: Any) -> PSClient:
        """A new client to all servers (closed with the cluster unless closed before)."""
        options.setdefault("job_id", self.job_id)
        options.setdefault("security", self.security)
        options.setdefault("replicas", self.replicas)
        client = PSClient(self.endpoints, timeout=timeout or self.timeout, **options)
        self._clients.append(client)
        return client

    def pid(self, rank: int) -> int:
        return self.processes[rank].pid

    def kill(self, rank: int) -> None:
        """SIGKILL server ``rank`` and reap it (no cleanup runs on its side)."""
        process = self.processes[rank]
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=_GRACE_S)

    def replace(self, rank: int) -> None:
        """Start a replacement for a killed server ``rank`` on its port (``--recover``:
        it copies its shards from the surviving copies; a replicated cluster)."""
        if self.processes[rank].poll() is None:
            raise ConfigError(f"local_cluster: server {rank} still runs; kill it first")
        self.processes[rank] = _spawn_one(
            rank, self.endpoints, self.log_dir, [*self._options, "--recover"], self._environ,
            self._fork,
        )  # fmt: skip

    def log_text(self, rank: int) -> str:
        """What server ``rank`` wrote to stderr so far."""
        path = self.log_dir / f"server.{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _stop(self) -> None:
        for client in self._clients:
            client.close()
        alive = [p for p in self.processes if p.poll() is None]
        if alive:
            ranks = [rank for rank, p in enumerate(self.processes) if p.poll() is None]
            try:
                with PSClient(
                    self.endpoints, timeout=2.0, job_id=self.job_id, security=self.security,
                    replicas=self.replicas,
                ) as client:  # fmt: skip
                    client.stop_servers(ranks=ranks)
            except SparsePSError as exc:  # best effort: signals follow
                log.debug("stop op failed: %s", exc)
        _reap(self.processes)


def _reap(processes: list[Server]) -> None:
    """Wait, then SIGTERM, then SIGKILL: nothing survives."""
    deadline = time.monotonic() + _GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_GRACE_S)


# touched by the main thread only (_shared_fork_server): no lock
_fork_servers: list[ForkServer] = []
_fork_servers_owner = 0  # the pid that started them: a forked copy of this module starts its own
# one per environment met (importing ray, say, sets RAY_CLIENT_MODE in this process), a few
# at most: each holds ~200 MB
_MAX_FORK_SERVERS = 4


def _shared_fork_server(env: dict[str, str]) -> ForkServer | None:
    """This process's fork server for servers with ``env``, started on first use; None
    where a server must start as a fresh interpreter (module docstring)."""
    global _fork_servers_owner
    if not fork_server_enabled(env) or threading.current_thread() is not threading.main_thread():
        return None
    if _fork_servers_owner != os.getpid():
        _fork_servers.clear()
        _fork_servers_owner = os.getpid()
    for server in _fork_servers:
        if server.serves_env(env):
            return server
    if len(_fork_servers) == _MAX_FORK_SERVERS:
        return None
    server = ForkServer(env)
    atexit.register(server.close)
    _fork_servers.append(server)
    return server


def _spawn_one(
    rank: int,
    endpoints: Sequence[str],
    log_dir: Path,
    options: list[str],
    environ: dict | None,
    fork: bool,
) -> Server:
    args = ["--rank", str(rank), "--endpoints", ",".join(endpoints), *options]
    env = {**process_environ(), **(environ or {})}
    forks = _shared_fork_server(env) if fork else None
    with open(log_dir / f"server.{rank}.log", "ab") as log_file:
        if forks is not None:
            with open(os.devnull, "wb") as devnull:
                process = forks.spawn_module(
                    _SERVER_MODULE, args, env, stdout=devnull.fileno(), stderr=log_file.fileno()
                )
            if process is not None:
                return process
        return subprocess.Popen(
            [sys.executable, "-m", _SERVER_MODULE, *args],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            env=env,
        )


def _spawn(
    endpoints: list[str], log_dir: Path, options: list[str], environ: dict | None, fork: bool
) -> list[Server]:
    return [
        _spawn_one(rank, endpoints, log_dir, options, environ, fork)
        for rank in range(len(endpoints))
    ]


def _wait_ready(cluster: LocalCluster, timeout: float) -> None:
    """Every server answers ping before ``timeout``, or an error says which did not and why."""
    deadline = time.monotonic() + timeout
    with PSClient(
        cluster.endpoints, timeout=timeout, job_id=cluster.job_id, security=cluster.security
    ) as client:
        for rank in range(len(cluster.endpoints)):
            while True:
                process = cluster.processes[rank]
                if process.poll() is not None:
                    raise UnavailableError(
                        f"server {rank} exited with code {process.returncode} during start-up: "
                        f"{cluster.log_text(rank).strip()[-500:]}",
                        op="start", role="server", rank=rank, address=cluster.endpoints[rank],
                    )  # fmt: skip
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise UnavailableError(
                        f"server {rank} did not answer ping within {timeout:.3g} s of start-up: "
                        f"{cluster.log_text(rank).strip()[-500:]}",
                        op="ping", role="server", rank=rank, address=cluster.endpoints[rank],
                    )  # fmt: skip
                try:
                    client.ping(timeout=min(0.5, remaining), ranks=[rank])
                    break
                except SparsePSError:
                    continue


@contextmanager
def local_cluster(
    servers: int = 1,
    *,
    timeout: float = 30.0,
    threads: int | None = None,
    max_message_bytes: int | None = None,
    environ: dict | None = None,
    job_id: str | None = None,
    key_dir: str | os.PathLike | None = None,
    replicas: int = 0,
    fork: bool = True,
) -> Iterator[LocalCluster]:
    """Start ``servers`` server processes on free loopback ports.

    Args:
        servers: number of server processes.
        timeout: seconds to wait for start-up, and the default timeout of ``.client()``.
        threads: handler threads per server (default: the server's default).
        max_message_bytes: the servers' message size limit (default: the protocol's).
        environ: extra environment variables for the server processes.
        job_id: the servers belong to this job and refuse other jobs' requests (the
            cluster's own clients send it); default: accept any.
        key_dir: the job's key folder (``sparseps keys DIR``): the servers use CURVE and
            the cluster's own clients the same keys; default: plain transport.
        replicas: backup copies of every shard (docs/replication.md); the cluster's
            clients use the same count.
        fork: fork the servers from this process's fork server where it can (module
            docstring); False: fresh interpreters (whose memory is their own alone).

    Yields:
        a :class:`LocalCluster`.

    Raises:
        ConfigError: servers < 1.
        UnavailableError: a server did not come up (its log tail is in the message).
    """
    if not isinstance(servers, int) or servers < 1:
        raise ConfigError(f"local_cluster: servers must be an int >= 1, got {servers!r}")
    options = [] if threads is None else ["--threads", str(threads)]
    if max_message_bytes is not None:
        options += ["--max-message-bytes", str(max_message_bytes)]
    if job_id is not None:
        options += ["--job-id", job_id]
    if replicas:
        options += ["--replicas", str(replicas)]
    security = None
    if key_dir is not None:
        options += ["--key-dir", os.fspath(key_dir)]
        security = security_from_key_dir(key_dir)
    with tempfile.TemporaryDirectory(prefix="sparseps-cluster-") as folder:
        log_dir = Path(folder)
        cluster = None
        for attempt in range(_START_ATTEMPTS):
            endpoints = [f"127.0.0.1:{free_port()}" for _ in range(servers)]
            cluster = LocalCluster(
                endpoints, _spawn(endpoints, log_dir, options, environ, fork), log_dir, timeout,
                job_id=job_id, security=security, replicas=replicas,
            )  # fmt: skip
            cluster._options, cluster._environ, cluster._fork = options, environ, fork
            try:
                _wait_ready(cluster, timeout)
                break
            except BaseException as exc:
                logs = "".join(cluster.log_text(r) for r in range(servers))
                _reap_now(cluster.processes)
                # Another process may have taken a port between free_port() and bind: retry.
                if (
                    "Address already in use" not in logs
                    or attempt == _START_ATTEMPTS - 1
                    or not isinstance(exc, UnavailableError)
                ):
                    raise
        assert cluster is not None  # the loop ends with a ready cluster or raises
        try:
            yield cluster
        finally:
            cluster._stop()


def _reap_now(processes: list[Server]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=_GRACE_S)
