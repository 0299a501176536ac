"""What an ok reply must hold before its caller reads it: the answer side of the op schema.

A reply is remote input, like a request: a server of another sparseps version, or a bug,
can answer ``prefetch`` without ``queued`` or ``move_export`` with a buffer too few. Read
as it came, that surfaced as a ``KeyError`` or a numpy shape error deep in the caller, far
from the server that sent it. :func:`check_answer` holds each ok reply to its op's
:attr:`~sparseps.rpc.ops.OpSchema.answer`,
:attr:`~sparseps.rpc.ops.OpSchema.answer_items` and
:attr:`~sparseps.rpc.ops.OpSchema.answer_bufs`; the client's
:class:`~sparseps.rpc.channel.Channel` calls it for every reply it delivers, so a
malformed one fails its call with a :class:`~sparseps.errors.ProtocolError` naming the op,
the server and what was missing, and the caller reads only what its op declares.

An op that declares nothing is not checked (its caller reads no field of the result).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import ProtocolError
from .ops import OpSchema
from .protocol import Reply

__all__ = ["check_answer"]


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def _check_fields(value: object, fields: Mapping[str, tuple[type, ...]], what: str) -> None:
    """``value`` is a mapping holding each of ``fields`` (name -> accepted types)."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is a {type(value).__name__}, not a mapping")
    for key, types in fields.items():
        if key not in value:
            raise ProtocolError(f"{what} has no {key!r}")
        field = value[key]
        # bool is an int to Python, never to the protocol
        if not isinstance(field, types) or (isinstance(field, bool) and bool not in types):
            raise ProtocolError(
                f"{what}'s {key!r} is a {type(field).__name__} (expected {_type_names(types)})"
            )


def check_answer(reply: Reply, schema: OpSchema | None) -> None:
    """Raise if the ok ``reply`` lacks what ``schema`` says its op answers.

    Raises:
        ProtocolError: the result (or an item of a list result) is not a mapping, misses
            a key or holds one of another type, or the buffers differ in number, dtype or
            dimensions from the schema's.
    """
    if not reply.ok or schema is None:
        return
    result = reply.result
    if schema.answer:
        _check_fields(result, schema.answer, "the result")
    if schema.answer_items:
        if not isinstance(result, list):
            raise ProtocolError(f"the result is a {type(result).__name__}, not a list")
        for i, item in enumerate(result):
            _check_fields(item, schema.answer_items, f"the result's item {i}")
    if schema.answer_bufs is None:
        return
    if len(reply.bufs) != len(schema.answer_bufs):
        names = ", ".join(spec.name for spec in schema.answer_bufs) or "none"
        raise ProtocolError(f"{len(reply.bufs)} buffers, not {len(schema.answer_bufs)} ({names})")
    for spec, array in zip(schema.answer_bufs, reply.bufs, strict=True):
        if array.dtype != np.dtype(spec.dtype) or array.ndim != spec.ndim:
            raise ProtocolError(
                f"buffer {spec.name!r} is {array.dtype} with shape {array.shape}, "
                f"not {spec.dtype} with {spec.ndim} dims"
            )
