"""Parquet: one sample per row, columns by name.

Worked example (schema ``Schema(label="label", dense=("price",), slots=("user", "tags"))``)::

    label: int8 | float    price: double          user: string     tags: list<uint64>
    1                      3.5                    "u_42"           [7, 9]
    0                      null                   null             []

- ``label``: any numeric column; a null label is a bad row. The schema's
  ``extra_labels`` are columns read the same way, into ``Batch.extra_labels``.
- dense columns: numeric (or numeric text); null is missing (0), then the schema's
  dense transform.
- a slot column is one of: ``list<uint64>``/``list<int64>`` (the ids as they are; int64
  ids are reinterpreted as uint64, bit for bit), a scalar integer column (one id per row),
  or a ``string`` column (hashed with the slot, as in the text formats; null or empty =
  no id). Null lists and null elements give no id.

Bad rows are described as ``file:row`` (1-based row of the file).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from .columns import (
    Parsed,
    float_column,
    integer_ids,
    list_slot,
    slot_from_ids,
    string_slot,
    transform_dense,
)
from .schema import Batch, Schema, Slot, extra_label_array, sample_id

__all__ = ["read_parquet"]

ROWS_PER_CHUNK = 65536


def _slot(column: pa.Array, name: str, keep: np.ndarray, path: str) -> Slot:
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if not pa.types.is_integer(kind.value_type):
            raise InputError(f"{path}: slot column {name!r} is {kind}; lists must hold integers")
        return list_slot(column, keep)
    if pa.types.is_integer(kind):
        ids = integer_ids(column.fill_null(0).to_numpy(zero_copy_only=False))
        present = column.is_valid().to_numpy(zero_copy_only=False)
        return slot_from_ids(ids, present, keep)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return string_slot(column, name, keep)
    raise InputError(
        f"{path}: slot column {name!r} has type {kind}; expected list<uint64|int64>, "
        "an integer column or a string column"
    )


def read_parquet(
    path: str, schema: Schema, *, file_no: int, max_examples: int = 5
) -> Iterator[Parsed]:
    """Parse a Parquet file in chunks of rows.

    Raises:
        InputError: the file is not Parquet or lacks a schema column.
    """
    try:
        handle = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc
    wanted = list(dict.fromkeys([*schema.labels, *schema.dense, *schema.slots]))
    missing = [n for n in wanted if n not in handle.schema_arrow.names]
    if missing:
        raise InputError(
            f"{path}: Parquet file lacks the schema's columns {', '.join(missing)} "
            f"(it has {', '.join(handle.schema_arrow.names)})"
        )
    row0 = 0
    record = 0
    for chunk in handle.iter_batches(batch_size=ROWS_PER_CHUNK, columns=wanted):
        label, has_label, bad = float_column(chunk.column(schema.label))
        bad = bad | ~has_label
        extra = np.zeros((chunk.num_rows, len(schema.extra_labels)), np.float64)
        for k, name in enumerate(schema.extra_labels):
            extra[:, k], present, bad_values = float_column(chunk.column(name))
            has_label &= present
            bad |= bad_values | ~present
        dense = np.zeros((chunk.num_rows, schema.num_dense), np.float64)
        for j, name in enumerate(schema.dense):
            values, _, bad_values = float_column(chunk.column(name))
            dense[:, j] = values
            bad |= bad_values
        keep = ~bad
        rows = int(keep.sum())
        batch = Batch(
            label[keep].astype(np.float32),
            transform_dense(dense[keep], schema.dense_transform),
            {n: _slot(chunk.column(n), n, keep, path) for n in schema.slots},
            sample_id(file_no, np.arange(record, record + rows)),
            extra_label_array(schema, extra[keep]),
        )
        examples = [
            (
                row0 + int(r) + 1,
                "no label" if not has_label[r] else "label or dense value is not a finite number",
            )
            for r in np.flatnonzero(bad)[:max_examples]
        ]
        yield Parsed(batch, int(bad.sum()), examples)
        row0 += chunk.num_rows
        record += rows
