"""``sparseps serve --workers N``: N service processes on one port.

One Python process answers on one core (its event loop and its model calls share a
GIL); a supervisor runs N of them. It binds the listening socket once (so ``--port 0``
works and no worker can miss the port) and starts each worker as
``python -m sparseps.cli serve ... --listen-fd FD --worker-index I --board FILE``,
handing the socket down: the workers accept from the one socket, and the kernel gives
each new connection to one of the workers waiting in ``accept``.

The workers share one copy of the model's rows: each maps the save's Arrow files
(:mod:`sparseps.checkpoint.mapped_table`), so their pages sit once in the page cache
whatever N is. Each worker follows the chain itself (its own :class:`ModelWatcher`,
polling every ``--poll-s``) and swaps its model in one assignment, so a request never sees
a half-applied model in any process. The processes are not swapped together: a worker
serves a save at most ``poll_s`` plus its load and warm-up time after the save landed
(the lag bound; docs/serving.md), and until then answers with the previous sequence (each
answer names its sequence). :mod:`.board` shows what each serves (``GET /model``:
``workers``, ``sequence_everywhere``).

The supervisor writes the ready file once every worker listens, with its own pid;
SIGTERM or SIGINT to it stops the workers (SIGTERM each, SIGKILL after 15 s) and it exits.
A worker that dies is started again (logged), at most ``_RESTARTS`` times in all.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UnavailableError
from ..files.manifest import write_json_atomic
from .board import WorkerBoard
from .config import ServeConfig
from .listen import bind

__all__ = ["WorkerPlace", "supervise"]

log = logging.getLogger(__name__)

_START_S = 300.0  # a worker loads the model and warms it up before it listens
_STOP_S = 15.0
_RESTARTS = 16


@dataclass(frozen=True)
class WorkerPlace:
    """Where one worker process serves: the inherited listening socket's fd, its slot on
    the board and the board file."""

    fd: int
    index: int
    board: str | None


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
        "--listen-fd", str(fd), "--worker-index", str(index), "--board", str(board),
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
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    work = Path(tempfile.mkdtemp(prefix="sparseps-serve-"))
    board = WorkerBoard.create(work / "board", count)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def start(index: int) -> subprocess.Popen:
        argv = _argv(config, sock.fileno(), index, board.path)
        return subprocess.Popen(argv, pass_fds=(sock.fileno(),))

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
        _stop(workers)
        if config.ready_file is not None:
            config.ready_file.unlink(missing_ok=True)
        sock.close()
        board.close()
        (work / "board").unlink(missing_ok=True)
        work.rmdir()


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
