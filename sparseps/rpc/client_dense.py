"""Dense tables through :class:`~sparseps.rpc.client.PSClient`: what each call sends.

A dense table (a model's non-embedding weights: one float32 vector) lives whole on one
server, the one :func:`sparseps.core.routing.dense_server_of` names for it over the
client's endpoint list (an elastic job's too: the job's start count), so every call here
is one request to that server's shard through the plain router (with replicas: to the
shard's head). Updates are checked finite before anything is sent: a NaN pushed into
shared weights would spoil every worker's next pull.

- ``create_dense(name, size, rule, init=None)``: blocks; idempotent for an equal table.
- ``pull_dense`` / ``push_dense`` / ``push_dense_delta`` / ``set_dense``: a
  :class:`~sparseps.rpc.handle.Handle` (the data plane of the dense sync); ``push_dense``
  with ``pull=True`` also brings back the values after its step.
- ``save_dense`` / ``load_dense``: the owning server's file (``dense.npz``), under the
  client's ``file_timeout``.

Server side: :mod:`sparseps.table.dense`; the worker's dense sync:
:mod:`sparseps.worker`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..core.routing import dense_server_of
from .client_checks import check_finite_vector
from .handle import Handle
from .router import result_of

if TYPE_CHECKING:
    from ..optim.base import Rule
    from .router import PlainRouter

__all__ = ["create_dense", "load_dense", "pull_dense", "save_dense", "update_dense"]


def _shard(router: PlainRouter, name: str) -> int:
    return dense_server_of(name, router.num_servers)


def create_dense(router: PlainRouter, name: str, size: int, rule: Rule,
                 init: np.ndarray | None) -> None:  # fmt: skip
    bufs = [] if init is None else [check_finite_vector(init, f"create_dense {name!r} init")]
    args = {"size": int(size), "rule": rule.to_dict()}
    call = router.request(_shard(router, name), "create_dense", name, bufs, args)
    Handle(router.channel, [call], _nothing).wait()


def pull_dense(router: PlainRouter, name: str) -> Handle:
    call = router.request(_shard(router, name), "pull_dense", name)
    return Handle(router.channel, [call], _values)


def update_dense(router: PlainRouter, op: str, name: str, values: np.ndarray, *,
                 pull: bool = False) -> Handle:  # fmt: skip
    """``push_dense``, ``push_dense_delta`` or ``set_dense``: the values checked finite;
    ``pull``: the handle answers the values after the step."""
    values = check_finite_vector(values, f"{op} {name!r}")
    args = {"pull": True} if pull else None
    call = router.request(_shard(router, name), op, name, [values], args)
    return Handle(router.channel, [call], _values if pull else _nothing)


def save_dense(router: PlainRouter, name: str, directory: str | os.PathLike,
               timeout: float) -> str:  # fmt: skip
    folder = os.path.abspath(os.fspath(directory))
    answers = router.each_shard("save_dense", name, {"directory": folder}, timeout=timeout,
                                pick=result_of, shards=[_shard(router, name)])  # fmt: skip
    return answers[0]["name"]


def load_dense(router: PlainRouter, name: str, path: str | os.PathLike, sha256: str | None,
               timeout: float) -> None:  # fmt: skip
    args = {"path": os.path.abspath(os.fspath(path)), "sha256": sha256}
    router.each_shard("load_dense", name, args, timeout=timeout, pick=result_of,
                      shards=[_shard(router, name)])  # fmt: skip


def _values(replies: list) -> np.ndarray:
    """The values a dense reply carries, as a fresh writable copy."""
    return replies[0].bufs[0].copy()


def _nothing(replies: list) -> None:
    return None
