"""The service's routes over a :class:`ModelWatcher`: ``POST /predict`` as a plain ASGI
callable (:mod:`.predict_route`, the hot path), the others as a Starlette app.

- ``POST /predict``: a body of :mod:`.requests` -> ``{"predictions": [...], "rows": n,
  "sequence": s}`` (``sequence``: the save of the model that answered). With
  ``Accept: application/vnd.apache.arrow.stream`` the answer is an Arrow stream of one
  ``prediction: float32`` column; the model's sequence is in the
  ``X-Sparseps-Model-Sequence`` header either way.
- ``GET /healthz``: 200 ``{"status": "ok", "sequence": s}``.
- ``GET /model``: the served base, deltas, sequence, passes, age, rows, reloads.
- ``GET /metrics``: Prometheus text (:mod:`.metrics`).

Errors are JSON ``{"error": message}``: 400 malformed (the message names the field), 413
too large (``Content-Length`` or the body read so far over ``max_body_bytes``; an Arrow
body that decodes to more; too many rows or feature ids), 415 another content type.
A body is parsed and checked into an Arrow table on a worker thread, so the event loop
keeps answering (``/healthz`` too) meanwhile; only a small JSON body (up to
``INLINE_BYTES``, which is also what it decodes to) is parsed on the event loop, where it
costs less than the thread hop. An Arrow body always goes to the thread: a few KB of it
may decompress to far more. The table then waits for a model call shared with the other
requests in flight (:mod:`.batcher`), or, the process's only request, is predicted where
it was parsed (``--batch-max-rows 0``: every request is).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..data.schema import Schema
from .batcher import Batcher
from .board import WorkerBoard
from .config import ServeConfig
from .metrics import CONTENT_TYPE, ServeMetrics
from .predict_route import PredictRoute, Receive, Scope, Send, model_call
from .watcher import ModelWatcher

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def create_app(
    watcher: ModelWatcher,
    config: ServeConfig,
    metrics: ServeMetrics,
    schema: Schema,
    *,
    on_startup: Callable[[], None] | None = None,
    on_shutdown: Callable[[], None] | None = None,
    board: WorkerBoard | None = None,
    connections: Callable[[], int] | None = None,
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The app over requests of ``schema``'s columns (:mod:`.request_schema`);
    ``on_startup``/``on_shutdown`` run once the server accepts / when it stops; ``board``:
    the workers' board of ``--workers N`` (:mod:`.board`), shown by ``/model``;
    ``connections``: the process's open connections (:mod:`.predict_route`)."""
    widths = {name: schema.dense.count(name) for name in dict.fromkeys(schema.dense)}
    columns = {
        "dense": list(widths),
        "slots": list(schema.slots),
        # a dense name the schema repeats k times: one column of k numbers per row
        "dense_lists": {name: k for name, k in widths.items() if k > 1},
    }
    metrics.follow(lambda: watcher.current.created_at, lambda: watcher.current.predictor.sequence)

    batcher = (
        Batcher(
            lambda served, tables: model_call(served, tables, schema),
            max_rows=config.batch_max_rows,
            max_wait_s=config.batch_max_wait_ms / 1e3,
        )
        if config.batch_max_rows > 0
        else None
    )
    predict = PredictRoute(watcher, config, metrics, schema, batcher, connections=connections)

    async def healthz(request: Request) -> Response:
        start = time.perf_counter()
        response = JSONResponse({"status": "ok", "sequence": watcher.current.predictor.sequence})
        metrics.observe("/healthz", 200, time.perf_counter() - start)
        return response

    async def model(request: Request) -> Response:
        start = time.perf_counter()
        served = watcher.current
        payload = {
            **served.describe(),
            "reloads": {"applied": watcher.applied, "refused": watcher.refused},
            "last_refusal": watcher.last_refusal,
            "request_columns": columns,
            "input": None if served.predictor.input is None else served.predictor.input.to_dict(),
            "workers": [] if board is None else board.read(),
            "sequence_everywhere": (
                served.predictor.sequence if board is None else board.sequence_everywhere()
            ),
            "batching": None
            if batcher is None
            else {
                "max_rows": batcher.max_rows,
                "max_wait_ms": batcher.max_wait_s * 1e3,
                **dataclasses.asdict(batcher.stats()),
            },
        }
        metrics.observe("/model", 200, time.perf_counter() - start)
        return JSONResponse(payload)

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_startup is not None:
            on_startup()
        try:
            yield
        finally:
            if batcher is not None:
                batcher.close()
            if on_shutdown is not None:
                on_shutdown()

    routes = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/model", model, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
            Route("/predict", _not_allowed, methods=["POST"]),  # answered by `predict`
        ],
        lifespan=lifespan,
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/predict" and scope["method"] == "POST":
            await predict(scope, receive, send)
        else:  # the other routes, the lifespan, a GET /predict's 405
            await routes(scope, receive, send)

    return app


async def _not_allowed(request: Request) -> Response:
    """Never called: ``POST /predict`` is answered below Starlette (:mod:`.predict_route`);
    the route is there so that Starlette answers another method on ``/predict`` with 405."""
    raise RuntimeError("POST /predict reached Starlette")
