"""The service's routes, as a Starlette app over a :class:`ModelWatcher`.

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
requests in flight (:mod:`.batcher`; ``--batch-max-rows 0``: a call per request, made
where the body was parsed).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import numpy as np
import orjson
import pyarrow as pa
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..data.schema import Batch, Schema
from ..errors import CheckpointError
from .batcher import Batcher
from .board import WorkerBoard
from .config import ServeConfig
from .metrics import CONTENT_TYPE, ServeMetrics
from .requests import ARROW_STREAM, RequestError, batch_from_body, checked_batch, table_from_body
from .watcher import ModelWatcher, ServedModel

__all__ = ["create_app"]

log = logging.getLogger(__name__)

# Bodies up to this size are parsed and predicted on the event loop: for them the hop to
# a worker thread and back (GIL handoffs) cost more than the work, measured on the shared
# 2-core box: a 1-row request's p50 was 8-33 ms through the thread pool, 4-5 ms inline.
# Larger bodies (about 100 JSON rows and up) go to the pool, so /healthz and /metrics stay
# responsive while they are worked on; so does every Arrow body (compressed: its size says
# little of its work).
INLINE_BYTES = 64 << 10
JSON_TYPES = ("application/json", "")


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past ``limit`` bytes before or while reading it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, f"Content-Length: {declared!r} is not a number")
        if int(declared) > limit:
            raise RequestError(413, f"body: {declared} bytes; the limit is {limit} (--max-body-mb)")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"body: over {limit} bytes (--max-body-mb)")
        parts.append(chunk)
    return b"".join(parts)


def _inline(body: bytes, content_type: str) -> bool:
    """Whether a body is small work: a JSON body of at most ``INLINE_BYTES``."""
    kind = content_type.split(";")[0].strip().lower()
    return len(body) <= INLINE_BYTES and kind in JSON_TYPES


def _table(body: bytes, content_type: str, config: ServeConfig, schema: Schema) -> pa.Table:
    return table_from_body(
        body,
        content_type,
        schema,
        max_rows=config.max_rows,
        max_ids=config.max_ids,
        max_decoded_bytes=config.max_body_bytes,
    )


def _parse(body: bytes, content_type: str, config: ServeConfig, schema: Schema) -> Batch:
    return batch_from_body(
        body,
        content_type,
        schema,
        max_rows=config.max_rows,
        max_ids=config.max_ids,
        max_decoded_bytes=config.max_body_bytes,
    )


def _predict(model: ServedModel, batch: Batch) -> np.ndarray:
    """The model's predictions for ``batch`` (one call: one request's rows, or several
    requests' gathered by the :class:`Batcher`)."""
    predictions = model.predictor.predict_batch(batch)
    finite = np.isfinite(predictions)
    if not finite.all():  # the inputs were checked (finite float32): the model is at fault
        row = int(np.flatnonzero(~finite)[0])
        raise CheckpointError(
            f"{model.predictor.saves[-1]}: the model predicted {predictions[row]} for row "
            f"{row} of a valid request"
        )
    return predictions


def _parse_and_predict(
    model: ServedModel, body: bytes, content_type: str, config: ServeConfig, schema: Schema
) -> np.ndarray:
    return _predict(model, _parse(body, content_type, config, schema))


def _answer(predictions: np.ndarray, sequence: int, arrow: bool) -> Response:
    headers = {"X-Sparseps-Model-Sequence": str(sequence)}
    if arrow:  # the column's buffer as it is (no copy) into the stream
        batch = pa.record_batch([pa.array(predictions, pa.float32())], ["prediction"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return Response(memoryview(sink.getvalue()), media_type=ARROW_STREAM, headers=headers)
    # orjson writes a float32 array's shortest float32 text, which reads back (as float64,
    # then float32) to the same float32 bits; 10-50x faster than json over .tolist()
    payload = {"predictions": predictions, "rows": int(predictions.size), "sequence": sequence}
    content = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, media_type="application/json", headers=headers)


def create_app(
    watcher: ModelWatcher,
    config: ServeConfig,
    metrics: ServeMetrics,
    schema: Schema,
    *,
    on_startup: Callable[[], None] | None = None,
    on_shutdown: Callable[[], None] | None = None,
    board: WorkerBoard | None = None,
) -> Starlette:
    """The app over requests of ``schema``'s columns (:mod:`.request_schema`);
    ``on_startup``/``on_shutdown`` run once the server accepts / when it stops; ``board``:
    the workers' board of ``--workers N`` (:mod:`.board`), shown by ``/model``."""
    widths = {name: schema.dense.count(name) for name in dict.fromkeys(schema.dense)}
    columns = {
        "dense": list(widths),
        "slots": list(schema.slots),
        # a dense name the schema repeats k times: one column of k numbers per row
        "dense_lists": {name: k for name, k in widths.items() if k > 1},
    }
    metrics.follow(lambda: watcher.current.created_at, lambda: watcher.current.predictor.sequence)

    def predict_tables(served: ServedModel, tables: list[pa.Table]) -> np.ndarray:
        """One model call for the checked tables of one or several requests."""
        if len(tables) == 1:
            table = tables[0]
        else:  # columns by name; a column a request lacks is null (missing) in its rows
            table = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
        return _predict(served, checked_batch(table, schema))

    batcher = (
        Batcher(
            predict_tables,
            max_rows=config.batch_max_rows,
            max_wait_s=config.batch_max_wait_ms / 1e3,
        )
        if config.batch_max_rows > 0
        else None
    )

    async def predict(request: Request) -> Response:
        start = time.perf_counter()
        model = watcher.current  # one model for the whole request
        rows = 0
        response: Response
        # counted from before its body is read: a model call waits for it (.batcher)
        arrival = batcher.arrival() if batcher is not None else None
        try:
            body = await _read_body(request, config.max_body_bytes)
            content_type = request.headers.get("content-type", "")
            inline = _inline(body, content_type)
            if arrival is None:  # one call per request, as before issue 60
                if inline:
                    predictions = _parse_and_predict(model, body, content_type, config, schema)
                else:
                    predictions = await run_in_threadpool(
                        _parse_and_predict, model, body, content_type, config, schema
                    )
            else:
                if inline:
                    table = _table(body, content_type, config, schema)
                else:
                    table = await run_in_threadpool(_table, body, content_type, config, schema)
                predictions = await arrival.predict(model, table, table.num_rows)
        except RequestError as exc:
            response = JSONResponse({"error": exc.message}, status_code=exc.status)
        except ValueError as exc:  # InputError from the lookup, a shape the head refuses
            response = JSONResponse({"error": f"request: {exc}"}, status_code=400)
        except Exception as exc:  # a bug: answer 500, log it, keep serving
            log.exception("POST /predict failed")
            response = JSONResponse({"error": f"internal: {exc}"}, status_code=500)
        else:  # the answer's encoding is the service's work: its errors are no 400
            rows = int(predictions.size)
            accept = request.headers.get("accept", "")
            response = _answer(predictions, model.predictor.sequence, ARROW_STREAM in accept)
        finally:
            if arrival is not None:
                arrival.done()
        metrics.observe("/predict", response.status_code, time.perf_counter() - start, rows)
        return response

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

    return Starlette(
        routes=[
            Route("/predict", predict, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/model", model, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
