"""Online serving: an HTTP prediction service that follows an inference chain.

``sparseps serve MODEL_DIR`` (docs/serving.md). One concept per module:

- :mod:`.config`: :class:`ServeConfig`, the service's settings, validated;
- :mod:`.requests`: a request body (JSON rows, JSON columns, Arrow) -> a ``Batch``, over
  :mod:`.limits` (``RequestLimits``, ``RequestError``), :mod:`.arrow_body` (an Arrow stream
  read batch by batch, each checked from its header, :mod:`.arrow_header`, before it is
  decoded) and :mod:`.request_columns` (the columns checked and converted);
- :mod:`.watcher`: :class:`ModelWatcher`, polls the chain and swaps immutable models;
- :mod:`.metrics`: :class:`ServeMetrics`, the Prometheus registry of one service;
- :mod:`.batcher`: ``Batcher``, concurrent requests gathered into one model call;
- :mod:`.app`: the Starlette routes (``/predict``, ``/healthz``, ``/model``, ``/metrics``);
- :mod:`.server`: :func:`serve`, uvicorn on a socket bound first;
- :mod:`.workers`: ``--workers N``, a supervisor of N service processes on one socket,
  and :mod:`.board`, what each of them serves;
- :mod:`.process`: :class:`ServeProcess`, the service in a child process (tests, bench,
  examples).

Names are imported on first use, so ``sparseps serve --help`` does not load torch.
"""

from __future__ import annotations

from ..core.lazy import lazy_names

__all__ = [
    "ModelWatcher",
    "RequestError",
    "ServeConfig",
    "ServeMetrics",
    "ServeProcess",
    "ServedModel",
    "batch_from_body",
    "criteo_request_rows",
    "serve",
]

_WHERE = {
    "ModelWatcher": "watcher",
    "ServedModel": "watcher",
    "RequestError": "requests",
    "batch_from_body": "requests",
    "criteo_request_rows": "requests",
    "ServeConfig": "config",
    "ServeMetrics": "metrics",
    "ServeProcess": "process",
    "serve": "server",
}

__getattr__ = lazy_names(__name__, _WHERE)
