"""``serve(config)``: the service on uvicorn, until SIGINT/SIGTERM.

The listening socket is bound here, before uvicorn starts, so that ``port=0`` works: the
port the kernel picked is logged and written to ``config.ready_file`` once the app has
started (the file is removed again when the service stops). A worker of
``--workers N`` (:mod:`.workers`) listens on nothing: its supervisor accepts and hands it
connections over a channel (:class:`HandedConnections`), and it reports on the
supervisor's board (:mod:`.board`) rather than in the ready file.

Once the model is loaded and warmed up, everything allocated so far (modules, the model)
is moved out of the garbage collector's reach (``gc.freeze``): a full collection then
walks only what requests allocate, not the ~200,000 objects of torch, pyarrow and the
app (a full collection of them took 127 ms of CPU on the 2-core box, 0.75-1.75 s of wall
time at load 17, and landed on whichever request was running).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

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

__all__ = ["HandedConnections", "serve"]

log = logging.getLogger(__name__)
_HANDED_AT_ONCE = 64  # connections read from the channel per wake-up at most


class HandedConnections(uvicorn.Server):
    """A uvicorn server whose connections are handed to it on ``channel`` (a Unix socket
    that carries connected sockets, ``SCM_RIGHTS``) rather than accepted from a listening
    socket: a worker of :mod:`.workers`. ``board`` counts the connections. When the channel
    closes (the supervisor is gone) the server stops."""

    def __init__(
        self, config: uvicorn.Config, channel: socket.socket, board: WorkerBoard | None
    ) -> None:
        super().__init__(config)
        self._channel = channel
        self._board = board

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # the app's lifespan, no listener
        if self.should_exit:
            return
        self._channel.setblocking(False)
        asyncio.get_running_loop().add_reader(self._channel.fileno(), self._receive)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._stop_receiving()
        await super().shutdown(sockets)

    def _stop_receiving(self) -> None:
        if self._channel.fileno() >= 0:
            asyncio.get_running_loop().remove_reader(self._channel.fileno())
            self._channel.close()

    def _protocol(self) -> asyncio.Protocol:
        """uvicorn's protocol for one connection (what its ``startup`` gives a listener),
        the connection counted on the board when it closes."""
        config = self.config
        protocol: Any = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=self.server_state, app_state=self.lifespan.state
        )
        board = self._board
        if board is not None:
            lost = protocol.connection_lost

            def connection_lost(exc: Exception | None) -> None:
                board.connection(opened=False)
                lost(exc)

            protocol.connection_lost = connection_lost
        return protocol

    def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(_HANDED_AT_ONCE):
            try:
                data, fds, _, _ = socket.recv_fds(self._channel, 16, 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.error("worker: the supervisor's channel failed (%s); stopping", exc)
                data, fds = b"", []
            if not data and not fds:  # the supervisor has gone
                log.warning("worker: the supervisor's channel closed; stopping")
                self._stop_receiving()
                self.should_exit = True
                return
            for fd in fds:
                loop.create_task(self._serve_connection(socket.socket(fileno=fd)))

    async def _serve_connection(self, conn: socket.socket) -> None:
        if self._board is not None:
            self._board.connection(opened=True)
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.get_running_loop().connect_accepted_socket(self._protocol, conn)
        except OSError as exc:  # the client left before it was served
            log.debug("worker: a handed connection failed (%s)", exc)
            conn.close()
            if self._board is not None:
                self._board.connection(opened=False)


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
    if board is not None and place is not None:  # every worker's metrics at any worker
        metrics.share(board.path.parent, place.index, board.workers)
    if place is None:
        sock = bind(config.host, config.port)
        host, port = sock.getsockname()[:2]
    else:  # the supervisor listens and hands this worker its connections
        sock = socket.socket(fileno=place.fd)
        host, port = config.host, config.port
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"

    def started() -> None:
        if place is not None:
            log.info("worker %d (pid %d) serving", place.index, os.getpid())
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
        watcher,
        config,
        metrics,
        schema,
        on_startup=started,
        on_shutdown=stopped,
        board=board,
        connections=lambda: len(server.server_state.connections),  # `server`: below
    )
    settings = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=10
    )
    server: uvicorn.Server = (
        uvicorn.Server(settings) if place is None else HandedConnections(settings, sock, board)
    )
    gc.collect()
    gc.freeze()  # see the module docstring
    with watcher:
        try:
            server.run(sockets=[sock] if place is None else [])
        finally:
            sock.close()
    log.info(
        "stopped serving %s (%s)",
        config.model_dir,
        json.dumps({"sequence": watcher.current.predictor.sequence}),
    )
