"""``sparseps serve --workers N``: N service processes on one port.

One Python process answers on one core (its event loop and its model calls share a
GIL); a supervisor runs N of them. It binds the listening socket once (so ``--port 0``
works and no worker can miss the port), accepts every connection itself and hands it to
the worker with the fewest open connections (ties: in turn), over a Unix socket pair per
worker (``SCM_RIGHTS``: the worker gets the connected socket, and the supervisor takes no
further part in it). Each worker starts as
``python -m sparseps.cli serve ... --channel-fd FD --worker-index I --board FILE``.

Why not let the workers accept from the shared socket: the kernel wakes every waiting
worker and the first to run accepts every connection queued, so a burst of connections
lands unevenly (4 connections opened at once: 3-1 or 4-0 in three tries of four on the
2-core box, 64: up to 44-17), and the busier worker sets the tail latency and caps the
rows/s. ``SO_REUSEPORT`` spreads by a hash of the addresses: even only on average. A
connection's requests all go to the worker it was handed to (HTTP keep-alive), so the
connections are what is balanced.

The workers share one copy of the model's rows: each maps the save's Arrow files
(:mod:`sparseps.checkpoint.mapped_table`), so their pages sit once in the page cache
whatever N is. Each worker follows the chain itself (its own :class:`ModelWatcher`,
polling every ``--poll-s``) and swaps its model in one assignment, so a request never sees
a half-applied model in any process. The processes are not swapped together: a worker
serves a save at most ``poll_s`` plus its load and warm-up time after the save landed
(the lag bound; docs/serving.md), and until then answers with the previous sequence (each
answer names its sequence). :mod:`.board` shows what each serves (``GET /model``:
``workers``, ``sequence_everywhere``).

The supervisor writes the ready file once every worker listens, with its own pid; it
hands connections only to workers that listen (before the first has, they wait in the
socket's backlog), and a worker whose supervisor has gone stops (its channel closes).
SIGTERM or SIGINT to it stops the workers (SIGTERM each, SIGKILL after 15 s) and it exits.
A worker that dies is started again (logged), at most ``_RESTARTS`` times in all.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.closing import Closing
from ..errors import UnavailableError
from ..files.manifest import write_json_atomic
from .board import WorkerBoard
from .config import ServeConfig
from .listen import bind

__all__ = ["Dispatcher", "WorkerPlace", "supervise"]

log = logging.getLogger(__name__)

_START_S = 300.0  # a worker loads the model and warms it up before it listens
_STOP_S = 15.0
_RESTARTS = 16
_POLL_S = 0.2  # the dispatcher looks at its stop flag this often


@dataclass(frozen=True)
class WorkerPlace:
    """Where one worker process serves: the fd of its end of the channel its connections
    come on, its slot on the board and the board file."""

    fd: int
    index: int
    board: str | None


class Dispatcher(Closing):
    """Accepts on ``sock`` on its own thread and hands each connection to a worker (see
    the module docstring). :meth:`attach` gives worker ``index`` a new channel (its start
    or restart); :meth:`close` stops accepting."""

    def __init__(self, sock: socket.socket, board: WorkerBoard) -> None:
        self._sock = sock
        self._board = board
        count = board.workers
        self._channels: list[socket.socket | None] = [None] * count
        self._sent = np.zeros(count, np.int64)  # connections handed to each worker
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serve-dispatch", daemon=True)
        self._thread.start()

    def attach(self, index: int) -> socket.socket:
        """A new channel for worker ``index``; returns the worker's end (to inherit)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        with self._lock:
            old = self._channels[index]
            self._channels[index] = mine
            self._sent[index] = 0
            self._board.clear(index)
        if old is not None:
            old.close()
        theirs.set_inheritable(True)
        return theirs

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_STOP_S)
        with self._lock:
            for channel in self._channels:
                if channel is not None:
                    channel.close()
            self._channels = [None] * len(self._channels)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        while not self._stop.is_set():
            if not self._listening().any():  # none yet (or all restarting): keep the backlog
                self._stop.wait(0.02)
                continue
            if not poller.poll(_POLL_S * 1e3):
                continue
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as exc:  # the socket was closed under us: stopping
                log.debug("serve: accept stopped (%s)", exc)
                return
            with conn:
                self._hand(conn)

    def _listening(self) -> np.ndarray:
        """Which workers have a channel and listen (their slot's pid is published)."""
        pids = np.array([slot["pid"] for slot in self._board.read()])
        return (pids != 0) & np.array([c is not None for c in self._channels])

    def _hand(self, conn: socket.socket) -> None:
        """Give ``conn`` to the listening worker with the fewest open connections (a
        connection no worker can take is closed: the client sees it reset)."""
        with self._lock:
            listening = self._listening()
            opened = self._sent - self._board.closed()
            count = len(self._channels)
            # fewest open first; among equals, in turn from the one after the last chosen
            turn = (np.arange(count) - self._next) % count
            for index in np.lexsort((turn, opened)).tolist():
                channel = self._channels[index]
                if not listening[index] or channel is None:
                    continue
                try:
                    socket.send_fds(channel, [b"c"], [conn.fileno()], socket.MSG_DONTWAIT)
                except OSError as exc:  # gone (restarted soon) or not reading: the next one
                    log.debug("serve: worker %d took no connection (%s)", index, exc)
                    continue
                self._sent[index] += 1
                self._next = (index + 1) % count
                return
        log.warning("serve: no worker could take a connection; it was closed")


def _argv(config: ServeConfig, fd: int, index: int, board: Path) -> list[str]:
    argv = [
        sys.executable, "-m", "sparseps.cli", "serve", str(config.model_dir),
        "--host", config.host, "--port", str(config.port), "--poll-s", str(config.poll_s),
        "--max-body-mb", repr(config.max_body_bytes / (1 << 20)),
        "--max-rows", str(config.max_rows), "--max-ids", str(config.max_ids),
        "--torch-threads", str(config.torch_threads),
        "--batch-max-rows", str(config.batch_max_rows),
        "--batch-max-wait-ms", repr(config.batch_max_wait_ms),
        "--workers", str(config.processes), "--index-dir", str(config.index_dir),
        "--channel-fd", str(fd), "--worker-index", str(index), "--board", str(board),
    ]  # fmt: skip
    if config.schema is not None:
        argv += ["--schema", config.schema]
    return argv


def supervise(config: ServeConfig) -> int:
    """Run ``config.processes`` workers until SIGTERM/SIGINT (blocks); returns the exit
    code: 0 after a stop, 1 when a worker could not start.

    Raises:
        ConfigError: the address cannot be bound.
    """
    count = config.processes
    sock = bind(config.host, config.port)
    sock.setblocking(False)
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    work = Path(tempfile.mkdtemp(prefix="sparseps-serve-"))
    board = WorkerBoard.create(work / "board", count)
    dispatcher = Dispatcher(sock, board)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def start(index: int) -> subprocess.Popen:
        channel = dispatcher.attach(index)
        try:
            argv = _argv(config, channel.fileno(), index, board.path)
            return subprocess.Popen(argv, pass_fds=(channel.fileno(),))
        finally:
            channel.close()  # the worker holds its end now

    workers = [start(i) for i in range(count)]
    try:
        _wait_listening(workers, board, lambda: stopping)
        log.info("serving %s on %s with %d workers", config.model_dir, url, count)
        if config.ready_file is not None:
            ready = {"url": url, "host": host, "port": port, "pid": os.getpid(), "workers": count}
            write_json_atomic(config.ready_file, ready)
        restarts = 0
        while not stopping:
            time.sleep(0.2)
            for i, worker in enumerate(workers):
                if worker.poll() is None or stopping:
                    continue
                if restarts >= _RESTARTS:
                    log.error("worker %d exited (%s); %d restarts already", i, worker.returncode,
                              restarts)  # fmt: skip
                    return 1
                restarts += 1
                log.error("worker %d (pid %d) exited with %s; starting it again", i,
                          worker.pid, worker.returncode)  # fmt: skip
                workers[i] = start(i)
        return 0
    except UnavailableError as exc:
        log.error("%s", exc)
        return 1
    finally:
        dispatcher.close()
        _stop(workers)
        if config.ready_file is not None:
            config.ready_file.unlink(missing_ok=True)
        sock.close()
        board.close()
        shutil.rmtree(work, ignore_errors=True)  # the board, the workers' metrics


def _wait_listening(workers: list[subprocess.Popen], board: WorkerBoard, stopped) -> None:
    """Until every worker has published its slot (it listens once it has).

    Raises:
        UnavailableError: a worker exited first, or none listened in ``_START_S``.
    """
    deadline = time.monotonic() + _START_S
    while not all(slot["pid"] for slot in board.read()):
        for i, worker in enumerate(workers):
            if worker.poll() is not None:
                raise UnavailableError(f"serve worker {i} exited with {worker.returncode}")
        if time.monotonic() > deadline or stopped():
            raise UnavailableError(f"serve workers did not all listen within {_START_S} s")
        time.sleep(0.05)


def _stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.terminate()
    deadline = time.monotonic() + _STOP_S
    for worker in workers:
        try:
            worker.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(_STOP_S)
