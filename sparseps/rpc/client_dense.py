"""Dense tables through :class:`~sparseps.rpc.client.PSClient`.

A dense table (a model's non-embedding weights: one float32 vector) lives whole on one
server, the one :func:`sparseps.core.routing.dense_server_of` names for it, so every
call here is one request to that server's shard (with replicas: to the shard's head). Updates are checked finite before anything is sent: a
NaN pushed into shared weights would spoil every worker's next pull.

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
from .client_parts import ClientParts
from .handle import Handle

if TYPE_CHECKING:
    from ..optim.base import Rule

__all__ = ["ClientDense"]


class ClientDense(ClientParts):
    """The dense-table calls, mixed into :class:`~sparseps.rpc.client.PSClient`."""

    def _dense_rank(self, name: str) -> int:
        return dense_server_of(name, self.num_servers)

    def create_dense(
        self, name: str, size: int, rule: Rule, init: np.ndarray | None = None
    ) -> None:
        """Create a dense table of ``size`` floats on its server (idempotent when equal)."""
        bufs = [] if init is None else [check_finite_vector(init, f"create_dense {name!r} init")]
        args = {"size": int(size), "rule": rule.to_dict()}
        call = self._shard_request(self._dense_rank(name), "create_dense", name, bufs, args)
        Handle(self._channel, [call], lambda _: None).wait()

    def pull_dense(self, name: str) -> Handle:
        """``wait()`` -> float32 ``[size]`` (a fresh writable copy)."""
        call = self._shard_request(self._dense_rank(name), "pull_dense", name)
        return Handle(self._channel, [call], _values)

    def _dense_op(self, op: str, name: str, values: np.ndarray, *, pull: bool = False) -> Handle:
        values = check_finite_vector(values, f"{op} {name!r}")
        args = {"pull": True} if pull else None
        call = self._shard_request(self._dense_rank(name), op, name, [values], args)
        return Handle(self._channel, [call], _values if pull else _nothing)

    def push_dense(self, name: str, grad: np.ndarray, *, pull: bool = False) -> Handle:
        """Apply a dense gradient with the table's rule. ``pull=True``: ``wait()`` -> the
        values after this step, float32 ``[size]`` (what a ``pull_dense`` sent right
        after would read, in the same round trip)."""
        return self._dense_op("push_dense", name, grad, pull=pull)

    def push_dense_delta(self, name: str, delta: np.ndarray) -> Handle:
        """Geo mode: add ``delta`` to the dense values."""
        return self._dense_op("push_dense_delta", name, delta)

    def set_dense(self, name: str, values: np.ndarray) -> Handle:
        """Overwrite the dense values (optimizer state is kept)."""
        return self._dense_op("set_dense", name, values)

    def save_dense(self, name: str, directory: str | os.PathLike) -> str:
        """The owning server writes the dense table (values + optimizer state) into
        ``directory``; returns the file name (``dense.npz``)."""
        folder = os.path.abspath(os.fspath(directory))
        shard = self._dense_rank(name)
        return self._each_shard(
            "save_dense", name, {"directory": folder},
            timeout=self.file_timeout, shards=[shard],
        )[0]["name"]  # fmt: skip

    def load_dense(self, name: str, path: str | os.PathLike, *, sha256: str | None = None) -> None:
        """The owning server restores the dense table from a :meth:`save_dense` file."""
        args = {"path": os.path.abspath(os.fspath(path)), "sha256": sha256}
        self._each_shard(
            "load_dense", name, args, timeout=self.file_timeout,
            shards=[self._dense_rank(name)],
        )  # fmt: skip


def _values(replies: list) -> np.ndarray:
    """The values a dense reply carries, as a fresh writable copy."""
    return replies[0].bufs[0].copy()


def _nothing(replies: list) -> None:
    return None
