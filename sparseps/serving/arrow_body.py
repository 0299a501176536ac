"""An Arrow IPC request body -> a table, its cost bounded before each batch is decoded.

The stream is read one message at a time (:class:`pyarrow.ipc.MessageReader`: no
decoding). The schema comes first: its columns are checked (names, types) before any
batch. Then, for each record batch, its header (:mod:`.arrow_header`) gives its rows, its
feature ids and the bytes it decodes to; they are added to the request's and checked
against the limits (:class:`~.limits.RequestLimits`), and only then is the batch decoded
(decompressed) and validated. A compressed bomb is refused from its headers, and a stream
that goes over a limit at its n-th batch has decoded n - 1 batches within the limits.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..data.schema import Schema
from .arrow_header import BatchHeader, MalformedHeader, batch_header
from .limits import RequestError, RequestLimits, check_ids, check_rows
from .request_columns import check_names, check_type, is_list

__all__ = ["MAX_BATCHES", "arrow_table"]

MAX_BATCHES = 1024  # record batches in one request: each costs a few Python steps


def _next_message(reader: pa.ipc.MessageReader) -> pa.ipc.Message | None:
    try:
        return reader.read_next_message()
    except StopIteration:
        return None


def arrow_table(body: bytes, schema: Schema, limits: RequestLimits) -> pa.Table:
    """The stream's table, each record batch checked from its header before decoding."""
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(body))
        first = _next_message(reader)
        if first is None or first.type != "schema":
            raise MalformedHeader("it does not start with a schema message")
        arrow_schema = pa.ipc.read_schema(first)
        ids_of = _IdsOfBatch(arrow_schema, schema)
        batches: list[pa.RecordBatch] = []
        rows = ids = size = 0
        while (message := _next_message(reader)) is not None:
            if message.type != "record batch":
                raise MalformedHeader(f"an unexpected {message.type} message")
            if len(batches) == MAX_BATCHES:
                raise RequestError(
                    413,
                    f"body: more than {MAX_BATCHES} Arrow record batches; send fewer, larger ones",
                )
            header = batch_header(message)
            rows, ids, size = rows + header.rows, ids + ids_of(header), size + header.decoded_bytes
            check_rows(rows, limits.rows)
            check_ids(ids, limits.ids)
            if size > limits.decoded_bytes:
                raise RequestError(
                    413,
                    f"body: decodes to {size} bytes or more (compressed Arrow buffers); the "
                    f"limit is {limits.decoded_bytes} (--max-body-mb)",
                )
            batch = pa.ipc.read_record_batch(message, arrow_schema)
            batch.validate(full=True)
            batches.append(batch)
    except (pa.ArrowException, OSError, MalformedHeader, UnicodeDecodeError) as exc:
        raise RequestError(400, f"body: not an Arrow IPC stream ({exc})") from None
    return pa.Table.from_batches(batches, arrow_schema)


class _IdsOfBatch:
    """Feature ids of one record batch, from its header: per slot column, its non-null
    values (a string or integer column) or the values of its lists (a list column).

    The request's columns are checked here, from the stream's schema, before any batch:
    names and types (:mod:`.request_columns`). So each column is one
    array (two for a list column: the lists, then their values) in a batch header.
    """

    def __init__(self, arrow_schema: pa.Schema, schema: Schema) -> None:
        check_names(arrow_schema.names, schema)
        flat: list[int] = []  # the array of each string or integer slot column
        values: list[int] = []  # the values array of each list slot column
        tops: list[int] = []  # the array of each column
        node = 0
        for field in arrow_schema:
            check_type(field.name, field.type, schema)
            tops.append(node)
            nested = is_list(field.type)
            if field.name in schema.slots:
                (values if nested else flat).append(node + nested)
            node += 1 + nested
        self.arrays = node
        self.flat, self.values, self.tops = (np.array(x, np.int64) for x in (flat, values, tops))

    def __call__(self, header: BatchHeader) -> int:
        nodes = header.nodes
        if len(nodes) != self.arrays:
            raise MalformedHeader(
                f"a record batch of {len(nodes)} arrays; its schema has {self.arrays}"
            )
        if (nodes[self.tops, 0] != header.rows).any():
            raise MalformedHeader(f"a column whose length is not its batch's ({header.rows})")
        flat = nodes[self.flat]
        return int((flat[:, 0] - flat[:, 1]).sum() + nodes[self.values, 0].sum())
