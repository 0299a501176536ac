"""``serve(config)``: the service on uvicorn, until SIGINT/SIGTERM.

The listening socket is bound here, before uvicorn starts, so that ``port=0`` works: the
port the kernel picked is logged and written to ``config.ready_file`` once the app has
started (the file is removed again when the service stops). A worker of
``--workers N`` (:mod:`.workers`) serves on the socket its supervisor bound instead, and
reports on the supervisor's board (:mod:`.board`) rather than in the ready file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import TYPE_CHECKING

import torch
import uvicorn

from ..files.manifest import write_json_atomic
from .app import create_app
from .board import WorkerBoard
from .config import ServeConfig
from .listen import bind
from .metrics import ServeMetrics
from .request_schema import RequestSchema
from .watcher import ModelWatcher

if TYPE_CHECKING:
    from .workers import WorkerPlace

__all__ = ["serve"]

log = logging.getLogger(__name__)


def serve(config: ServeConfig, place: WorkerPlace | None = None) -> None:
    """Load the model, listen, serve until stopped (blocks).

    Args:
        config: the service's settings.
        place: for a worker of ``--workers N``: the inherited socket and its board slot.

    Raises:
        CheckpointError: ``config.model_dir`` holds no chain that loads.
        ConfigError: the address cannot be bound.
    """
    torch.set_num_threads(config.torch_threads)
    metrics = ServeMetrics()
    columns = RequestSchema(config.request_schema)
    board = (
        WorkerBoard(place.board, place.index)
        if place is not None and place.board is not None
        else None
    )
    watcher: ModelWatcher

    def publish(served: object = None) -> None:
        if board is not None:
            board.publish(watcher.current.predictor.sequence, watcher.applied, watcher.refused)

    watcher = ModelWatcher(
        config.model_dir,
        poll_s=config.poll_s,
        on_reload=metrics.on_reload,
        warmup=columns.warm_up,
        on_swap=publish,
        index_dir=config.index_dir,
    )
    schema = columns.fix(watcher.current.predictor)  # the first served model's, for good
    sock = bind(config.host, config.port) if place is None else socket.socket(fileno=place.fd)
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"

    def started() -> None:
        if place is not None:
            log.info("worker %d (pid %d) serving on %s", place.index, os.getpid(), url)
            publish()
            return
        log.info("serving %s on %s", config.model_dir, url)
        if config.ready_file is not None:
            ready = {"url": url, "host": host, "port": port, "pid": os.getpid()}
            write_json_atomic(config.ready_file, ready)

    def stopped() -> None:
        if config.ready_file is not None and place is None:
            config.ready_file.unlink(missing_ok=True)

    app = create_app(
        watcher, config, metrics, schema, on_startup=started, on_shutdown=stopped, board=board
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=10
        )
    )
    with watcher:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()
    log.info(
        "stopped serving %s (%s)",
        config.model_dir,
        json.dumps({"sequence": watcher.current.predictor.sequence}),
    )
