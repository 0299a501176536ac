"""``POST /predict`` as a plain ASGI callable, below Starlette.

The route is the service's hot path: a 1-row request costs a few hundred microseconds
of CPU to parse and convert, and Starlette's layers (its middleware stack, routing,
``Request`` and ``Response`` objects) cost ~0.3 ms more per request under the profiler.
So :mod:`.app` sends ``POST /predict`` here and every other request to Starlette (a
``GET /predict`` gets Starlette's 405, as before). What the route answers is what it
answered as a Starlette route: the same statuses, JSON error bodies (``{"error": ...}``
as Starlette's ``JSONResponse`` wrote them), headers (``content-length``,
``content-type``, ``x-sparseps-model-sequence``) and limits.

A body is read within ``--max-body-mb`` (its ``Content-Length`` checked before it is
read, a chunked body while it is read), parsed and checked into an Arrow table (on the
event loop when it is a JSON body of at most ``INLINE_BYTES``, on a worker thread
otherwise), then predicted: by a call made where it was parsed when it is the only
request of the process (:meth:`.Arrival.alone`), else in a call shared with the others
(:mod:`.batcher`); ``--batch-max-rows 0``: a call per request, made where it was parsed.

On the event loop a lone call is made only when the request's connection is the
process's only one (``connections``): while the call holds the loop, the requests of
other connections cannot be read, and under 64 clients every request that found the
batcher idle for a moment made a 1-row call of its own, one after the other (measured:
the 64-client rows/s fell to a third). Made on the parsing thread, a call leaves the loop
reading the next requests, which queue for the batcher.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from starlette.concurrency import run_in_threadpool

from ..data.schema import Schema
from ..errors import CheckpointError
from .batcher import Arrival, Batcher
from .config import ServeConfig
from .metrics import ServeMetrics
from .request_columns import checked_batch
from .requests import ARROW_STREAM, RequestError, table_from_body
from .watcher import ModelWatcher, ServedModel

__all__ = ["INLINE_BYTES", "PredictRoute", "model_call"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Bodies up to this size are parsed (and, alone, predicted) on the event loop: for them
# the hop to a worker thread and back (GIL handoffs) cost more than the work, measured on
# the shared 2-core box: a 1-row request's p50 was 8-33 ms through the thread pool, 4-5 ms
# inline. Larger bodies (about 100 JSON rows and up) go to the pool, so /healthz and
# /metrics stay responsive while they are worked on; so does every Arrow body
# (compressed: its size says little of its work).
INLINE_BYTES = 64 << 10
JSON_TYPES = ("application/json", "")
_JSON = b"application/json"


class _Disconnected(Exception):
    """The client went away before its body was read."""


def model_call(model: ServedModel, tables: list[pa.Table], schema: Schema) -> np.ndarray:
    """The model's predictions for the checked tables of one or several requests (one
    call; the tables of several are concatenated, columns by name, a column a request
    lacks null (missing) in its rows).

    Raises:
        RequestError: a value that does not convert (400).
        CheckpointError: the model predicted a non-finite number for a valid row.
    """
    if len(tables) == 1:
        table = tables[0]
    else:
        table = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
    predictions = model.predictor.predict_batch(checked_batch(table, schema))
    finite = np.isfinite(predictions).reshape(len(predictions), -1).all(axis=1)
    if not finite.all():  # the inputs were checked (finite float32): the model is at fault
        row = int(np.flatnonzero(~finite)[0])
        raise CheckpointError(
            f"{model.predictor.saves[-1]}: the model predicted {predictions[row]} for row "
            f"{row} of a valid request"
        )
    return predictions


class PredictRoute:
    """The ASGI callable of ``POST /predict`` (see the module docstring); ``batcher``:
    None with ``--batch-max-rows 0``."""

    def __init__(
        self,
        watcher: ModelWatcher,
        config: ServeConfig,
        metrics: ServeMetrics,
        schema: Schema,
        batcher: Batcher | None,
        *,
        connections: Callable[[], int] | None = None,
    ) -> None:
        self._watcher = watcher
        self._connections = connections
        self._config = config
        self._metrics = metrics
        self._schema = schema
        self._batcher = batcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        model = self._watcher.current  # one model for the whole request
        length = kind = accept = None
        for name, value in scope["headers"]:  # the first of each, as Starlette's get()
            if name == b"content-length" and length is None:
                length = value.decode("latin-1")
            elif name == b"content-type" and kind is None:
                kind = value.decode("latin-1")
            elif name == b"accept" and accept is None:
                accept = value.decode("latin-1")
        # counted from before its body is read: a model call waits for it (.batcher)
        arrival = self._batcher.arrival() if self._batcher is not None else None
        rows = 0
        content: bytes | memoryview
        headers: list[tuple[bytes, bytes]] = [(b"content-type", _JSON)]  # an error's
        try:
            body = await _read_body(receive, length, self._config.max_body_bytes)
            predictions = await self._predict(model, body, kind or "", arrival)
        except _Disconnected:
            log.debug("POST /predict: the client left before its body was read")
            return
        except RequestError as exc:
            status, content = exc.status, _error(exc.message)
        except ValueError as exc:  # InputError from the lookup, a shape the head refuses
            status, content = 400, _error(f"request: {exc}")
        except Exception as exc:  # a bug: answer 500, log it, keep serving
            log.exception("POST /predict failed")
            status, content = 500, _error(f"internal: {exc}")
        else:
            status, rows = 200, len(predictions)
            sequence = model.predictor.sequence
            try:  # the answer's encoding is the service's work: its errors are no 400
                content, media = _encode(predictions, sequence, ARROW_STREAM in (accept or ""))
            except Exception as exc:
                log.exception("POST /predict: encoding the answer failed")
                status, content, rows = 500, _error(f"internal: {exc}"), 0
            else:
                headers = [
                    (b"x-sparseps-model-sequence", str(sequence).encode()),
                    (b"content-type", media),
                ]
        finally:
            if arrival is not None:
                arrival.done()
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        self._metrics.observe("/predict", status, time.perf_counter() - start, rows)

    async def _predict(
        self, model: ServedModel, body: bytes, kind: str, arrival: Arrival | None
    ) -> np.ndarray:
        inline = len(body) <= INLINE_BYTES and kind.split(";")[0].strip().lower() in JSON_TYPES
        if inline:  # a lone call here holds the loop: only for the one connection's request
            lone = self._connections is not None and self._connections() <= 1
            table, alone = self._parse(model, body, kind, arrival, lone=lone)
        else:
            table, alone = await run_in_threadpool(self._parse, model, body, kind, arrival)
        if alone is not None:
            return alone
        assert arrival is not None  # without a batcher, _parse predicted
        return await arrival.predict(model, table, table.num_rows)

    def _parse(
        self,
        model: ServedModel,
        body: bytes,
        kind: str,
        arrival: Arrival | None,
        *,
        lone: bool = True,
    ) -> tuple[pa.Table, np.ndarray | None]:
        """The request's checked table, and its predictions when they were made here:
        without a batcher, or as the process's only request (``lone``: it may be)."""
        config, schema = self._config, self._schema
        table = table_from_body(
            body,
            kind,
            schema,
            max_rows=config.max_rows,
            max_ids=config.max_ids,
            max_decoded_bytes=config.max_body_bytes,
        )
        if arrival is None:  # one call per request, as before issue 60
            return table, model_call(model, [table], schema)
        return table, arrival.alone(model, table, table.num_rows) if lone else None


async def _read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The body, refused (413) past ``limit`` bytes before or while reading it.

    Raises:
        RequestError: 400 for a ``Content-Length`` that is no number, 413 past the limit.
        _Disconnected: the client left first.
    """
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, f"Content-Length: {declared!r} is not a number")
        if int(declared) > limit:
            raise RequestError(413, f"body: {declared} bytes; the limit is {limit} (--max-body-mb)")
    parts, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"body: over {limit} bytes (--max-body-mb)")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _error(message: str) -> bytes:
    """``{"error": message}`` as Starlette's ``JSONResponse`` writes it."""
    return json.dumps(
        {"error": message}, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def _encode(
    predictions: np.ndarray, sequence: int, arrow: bool
) -> tuple[bytes | memoryview, bytes]:
    """The answer's body and media type: an Arrow stream of one ``prediction`` column
    (``prediction_0`` ... for a head of several outputs), or ``{"predictions": [...],
    "rows": n, "sequence": s}`` (a list per row for several outputs)."""
    if arrow:  # one output: the column's buffer as it is (no copy) into the stream
        if predictions.ndim == 1:
            batch = pa.record_batch([pa.array(predictions, pa.float32())], ["prediction"])
        else:
            columns = [pa.array(column, pa.float32()) for column in predictions.T]
            names = [f"prediction_{i}" for i in range(len(columns))]
            batch = pa.record_batch(columns, names)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return memoryview(sink.getvalue()), ARROW_STREAM.encode()
    # orjson writes a float32 array's shortest float32 text, which reads back (as float64,
    # then float32) to the same float32 bits; 10-50x faster than json over .tolist()
    payload = {
        "predictions": np.ascontiguousarray(predictions),  # rows of a head's outputs: lists
        "rows": len(predictions),
        "sequence": sequence,
    }
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), _JSON
