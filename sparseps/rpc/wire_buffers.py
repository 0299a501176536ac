"""The numpy buffers of a message: the dtype allowlist, how a header describes them, and
their checked decoding from frames (no copy: read-only views of the received memory).

:mod:`.protocol` builds and reads the headers; everything about one buffer's dtype,
shape and bytes is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from ..errors import ProtocolError
from .limits import Limits

__all__ = [
    "DTYPES",
    "buffer_header",
    "decode_buffers",
    "described_buffers",
    "frame_bytes",
    "wire_name",
]

# Wire dtype names -> explicit little-endian numpy dtypes (the allowlist).
DTYPES: dict[str, np.dtype] = {
    "uint64": np.dtype("<u8"),
    "float32": np.dtype("<f4"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("u1"),
}
_NAME_OF = {dt: name for name, dt in DTYPES.items()}
_MAX_NDIM = 4


def frame_bytes(frame) -> memoryview:
    """The payload of a zmq Frame (``recv(copy=False)``) or of a bytes-like object."""
    buf = getattr(frame, "buffer", None)
    return buf if buf is not None else memoryview(frame)


def buffer_header(arrays: Sequence[np.ndarray]) -> list:
    described = []
    for i, array in enumerate(arrays):
        name = _NAME_OF.get(array.dtype)
        if name is None:
            raise ProtocolError(
                f"buffer {i}: dtype {array.dtype} cannot be sent "
                f"(allowed: {', '.join(DTYPES)}, little-endian)"
            )
        if not array.flags.c_contiguous:
            raise ProtocolError(f"buffer {i}: must be C-contiguous (use np.ascontiguousarray)")
        described.append([name, list(array.shape)])
    return described


def decode_buffers(described, frames: Sequence, limits: Limits, where: str) -> list[np.ndarray]:
    checked = described_buffers(described, limits, where)
    if len(checked) != len(frames):
        raise ProtocolError(
            f"{where}: header declares {len(checked)} buffers but {len(frames)} buffer frames arrived"
        )
    arrays = []
    for i, (dtype, shape) in enumerate(checked):
        payload = frame_bytes(frames[i])
        declared = prod(shape) * dtype.itemsize
        if payload.nbytes != declared:
            raise ProtocolError(
                f"{where}: buffer {i} is {payload.nbytes} bytes but {_NAME_OF[dtype]}{shape} needs {declared}"
            )
        array = np.frombuffer(payload, dtype=dtype).reshape(shape)
        array.flags.writeable = False  # a view of the received frame: handlers must not write it
        arrays.append(array)
    return arrays


def described_buffers(
    described, limits: Limits, where: str
) -> list[tuple[np.dtype, tuple[int, ...]]]:
    """``(dtype, shape)`` of each buffer a header declares, checked."""
    if not isinstance(described, list):
        raise ProtocolError(f"{where}: 'bufs' must be a list, got {type(described).__name__}")
    if len(described) > limits.max_buffers:
        raise ProtocolError(
            f"{where}: {len(described)} buffers, over the limit of {limits.max_buffers}"
        )
    checked = []
    total = 0
    for i, entry in enumerate(described):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise ProtocolError(
                f"{where}: buffer {i} must be described as [dtype, shape], got {entry!r:.80}"
            )
        name, shape = entry
        dtype = DTYPES.get(name)
        if dtype is None:
            raise ProtocolError(
                f"{where}: buffer {i} dtype {name!r:.40} not allowed (allowed: {', '.join(DTYPES)})"
            )
        if not (
            isinstance(shape, list)
            and len(shape) <= _MAX_NDIM
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ProtocolError(
                f"{where}: buffer {i} shape must be a list of at most {_MAX_NDIM} non-negative ints, got {shape!r:.80}"
            )
        # Python ints do not overflow, so a huge declared shape cannot wrap around the check.
        declared = prod(shape) * dtype.itemsize
        total += declared
        if total > limits.max_message_bytes:
            raise ProtocolError(
                f"{where}: buffers declare {total} bytes, over the limit of {limits.max_message_bytes}"
            )
        checked.append((dtype, tuple(shape)))
    return checked


def wire_name(dtype: np.dtype) -> str | None:
    """The wire name of ``dtype`` (None: not on the allowlist)."""
    return _NAME_OF.get(dtype)
