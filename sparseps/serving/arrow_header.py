"""What an Arrow IPC record batch holds, read from its header before it is decoded.

An IPC message is a header (a flatbuffer ``Message``, Arrow's ``format/Message.fbs``)
and a body. The header of a record batch gives its length (rows), one ``FieldNode``
``{length, null_count}`` per array in depth-first schema order (a list column is two:
the lists, then their values), and one ``Buffer`` ``{offset, length}`` per buffer of the
body; when the body is compressed (a ``BodyCompression`` is present), each buffer starts
with its decompressed length as a little-endian int64 (-1: stored uncompressed). So the
rows, the values of every array and the bytes the batch decodes to are known from the
header plus 8 bytes per buffer, before anything is decompressed: a 4 KB zstd body that
decodes to 128 MB is seen as 128 MB.

pyarrow reads the header for us (``pa.ipc.Message``) but does not expose its fields, so
the few needed are read here from the flatbuffer, every offset bounds-checked (a header
that points outside itself raises :class:`MalformedHeader`). Flatbuffer layout in brief:
a table starts with an int32 ``soffset``; its vtable is at ``table - soffset`` and holds
uint16 ``vtable size``, ``table size``, then one uint16 offset (from the table) per field
(0 or past the vtable: absent); a table or vector field holds a uint32 offset from
itself; a vector is a uint32 count then its elements.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["BatchHeader", "MalformedHeader", "batch_header"]

_RECORD_BATCH = 3  # MessageHeader union: Schema=1, DictionaryBatch=2, RecordBatch=3
# field ids: Message {version, header_type, header, bodyLength, custom_metadata};
# RecordBatch {length, nodes, buffers, compression, variadicBufferCounts}
_HEADER_TYPE, _HEADER = 1, 2
_LENGTH, _NODES, _BUFFERS, _COMPRESSION = 0, 1, 2, 3


class MalformedHeader(ValueError):
    """A record batch header that cannot be read (the message says where)."""


@dataclass(frozen=True)
class BatchHeader:
    """One record batch as its header describes it.

    Attributes:
        rows: the batch's length.
        nodes: int64 ``[arrays, 2]``: ``length`` and ``null_count`` of each array, in
            depth-first schema order.
        decoded_bytes: what its buffers take once decoded (decompressed).
    """

    rows: int
    nodes: np.ndarray
    decoded_bytes: int


def _read(data: bytes, fmt: str, pos: int) -> int:
    if pos < 0 or pos + struct.calcsize(fmt) > len(data):
        raise MalformedHeader(f"offset {pos} is outside the {len(data)}-byte header")
    return int(struct.unpack_from(fmt, data, pos)[0])


def _field(data: bytes, table: int, index: int) -> int:
    """Position of field ``index`` of the table at ``table``; 0 when absent."""
    vtable = table - _read(data, "<i", table)
    slot = 4 + 2 * index
    if slot + 2 > _read(data, "<H", vtable):
        return 0
    offset = _read(data, "<H", vtable + slot)
    return table + offset if offset else 0


def _target(data: bytes, pos: int) -> int:
    """Where the uint32 offset stored at ``pos`` points."""
    return pos + _read(data, "<I", pos)


def _pairs(data: bytes, pos: int) -> np.ndarray:
    """The vector of 16-byte structs (two int64) at field position ``pos``: ``[n, 2]``."""
    if not pos:
        return np.zeros((0, 2), np.int64)
    start = _target(data, pos)
    count = _read(data, "<I", start)
    if start + 4 + 16 * count > len(data):
        raise MalformedHeader(f"a vector of {count} entries runs past the header")
    return np.frombuffer(data, "<i8", count=2 * count, offset=start + 4).reshape(count, 2)


def batch_header(message: pa.ipc.Message) -> BatchHeader:
    """The header of one record batch message.

    Raises:
        MalformedHeader: not a record batch, an offset outside the header, a buffer
            outside the body, or a negative length.
    """
    data = message.metadata.to_pybytes()
    root = _target(data, 0)
    kind = _field(data, root, _HEADER_TYPE)
    if not kind or _read(data, "<B", kind) != _RECORD_BATCH:
        raise MalformedHeader("the message is not a record batch")
    at = _field(data, root, _HEADER)
    if not at:
        raise MalformedHeader("a record batch message without its header")
    batch = _target(data, at)
    length = _field(data, batch, _LENGTH)
    rows = _read(data, "<q", length) if length else 0
    nodes = _pairs(data, _field(data, batch, _NODES))
    buffers = _pairs(data, _field(data, batch, _BUFFERS))
    compressed = bool(_field(data, batch, _COMPRESSION))
    if rows < 0 or (nodes < 0).any() or (buffers < 0).any():
        raise MalformedHeader("a negative length, count or offset")
    size = message.body.size if message.body is not None else 0
    offset, extent = buffers[:, 0], buffers[:, 1]
    if (offset > size - extent).any():  # no overflow: both are >= 0
        raise MalformedHeader(f"a buffer lies outside the {size}-byte body")
    return BatchHeader(rows, nodes, _decoded_bytes(message, offset, extent, compressed))


def _decoded_bytes(
    message: pa.ipc.Message, offset: np.ndarray, extent: np.ndarray, compressed: bool
) -> int:
    if not compressed:
        return int(extent.sum())
    present = extent > 0
    if not present.any():
        return 0
    if (extent[present] < 8).any():
        raise MalformedHeader("a compressed buffer shorter than its 8-byte length prefix")
    body = np.frombuffer(message.body, np.uint8)
    prefix = body[offset[present, None] + np.arange(8)].view("<i8").reshape(-1)
    if (prefix < -1).any():
        raise MalformedHeader("a compressed buffer with a negative decompressed length")
    stored = extent[present] - 8
    return int(np.where(prefix == -1, stored, prefix).sum())
