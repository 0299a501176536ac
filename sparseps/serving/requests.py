"""A ``POST /predict`` body -> a :class:`sparseps.data.Batch`, validated at the boundary.

Three body shapes, all turned into one Arrow table, then into a batch column by column
(pyarrow and numpy; no Python loop over rows)::

    JSON rows      {"rows": [{"I1": 3, "I2": null, "C1": "68fd1e64", ...}, ...]}
    JSON columns   {"columns": {"I1": [3, 0], "C1": ["68fd1e64", "a1"], ...}}
    Arrow          Content-Type: application/vnd.apache.arrow.stream (an IPC stream)

Columns are those of the request schema (``sparseps serve --schema``, Criteo by default):
its dense columns (numbers or numeric text; null or absent = missing, then the schema's
dense transform) and its slots, one of: a string (hashed with the slot, exactly as the
data files are), an integer id, or a list of integer ids (JSON integers must be below
2**63; a negative one is the uint64 with the same bits; use Arrow ``uint64`` for any id).
A column the schema does not name is refused, except its label columns, which are
ignored; an absent column is missing in every row. Every refusal is a
:class:`RequestError` whose message names the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..data.columns import (
    float_column,
    integer_ids,
    list_slot,
    slot_from_ids,
    string_slot,
    transform_dense,
)
from ..data.schema import CRITEO, Batch, Schema, Slot
from ..errors import InputError

__all__ = [
    "ARROW_STREAM", "RequestError", "batch_from_body", "batch_from_table", "criteo_request_rows",
]  # fmt: skip

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class RequestError(InputError):
    """A request the service refuses; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self) -> tuple:
        return (RequestError, (self.status, self.message))


def batch_from_body(body: bytes, content_type: str, schema: Schema, *, max_rows: int) -> Batch:
    """Parse and validate one request body.

    Raises:
        RequestError: 400 (malformed, naming the field), 413 (more than ``max_rows``
            rows), 415 (a content type other than JSON or Arrow).
    """
    kind = content_type.split(";")[0].strip().lower()
    if kind == ARROW_STREAM:
        table = _arrow_table(body)
    elif kind in ("application/json", ""):
        table = _json_table(body, max_rows, schema)
    else:
        raise RequestError(415, f"Content-Type: {kind!r} is not application/json or {ARROW_STREAM}")
    return batch_from_table(table, schema, max_rows=max_rows)


def _arrow_table(body: bytes) -> pa.Table:
    try:
        return pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise RequestError(400, f"body: not an Arrow IPC stream ({exc})") from None


def _json_table(body: bytes, max_rows: int, schema: Schema) -> pa.Table:
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise RequestError(400, f"body: not valid JSON ({exc})") from None
    if not isinstance(payload, dict) or len(payload.keys() & {"rows", "columns"}) != 1:
        raise RequestError(
            400, "body: expected a JSON object with exactly one of 'rows' or 'columns'"
        )
    extra = sorted(payload.keys() - {"rows", "columns"})
    if extra:
        raise RequestError(400, f"body: unknown field(s) {extra}; expected 'rows' or 'columns'")
    if "rows" in payload:
        rows = payload["rows"]
        if not isinstance(rows, list):
            raise RequestError(400, "rows: expected a list of objects (column: value)")
        _check_rows(len(rows), max_rows)
        if not rows:
            raise RequestError(400, "rows: the request holds no rows")
        array = _typed_rows(rows, schema)
        if array is None:
            try:
                array = pa.array(rows)  # type inference: slower, finds mixed types
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
                raise RequestError(400, _row_problem(rows, exc)) from None
        if not pa.types.is_struct(array.type):
            raise RequestError(400, _row_problem(rows, TypeError(str(array.type))))
        return pa.Table.from_struct_array(array)
    columns = payload["columns"]
    if not isinstance(columns, dict) or not all(isinstance(v, list) for v in columns.values()):
        raise RequestError(400, "columns: expected an object of column name: list of values")
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise RequestError(400, f"columns: the lists differ in length ({lengths})")
    _check_rows(next(iter(lengths.values()), 0), max_rows)
    arrays = {}
    for name, values in columns.items():
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RequestError(400, f"columns.{name}: {_arrow_message(exc)}") from None
    return pa.table(arrays)


_GUESS_ROWS = 8  # rows looked at to guess a slot column's type


def _typed_rows(rows: list, schema: Schema) -> pa.StructArray | None:
    """``rows`` converted with a guessed type, or None to convert them with inference.

    Inference costs pyarrow about 0.7 ms even for one row (it tries to import optional
    modules on every call); with a type the conversion of a 1-row request takes 10 µs.
    Dense and label columns are float64; a slot column's type comes from its first
    non-null value in the first rows. A wrong guess (a numeric text, mixed types, a
    non-object row) fails and falls back to inference, which finds the error.
    """
    try:
        names = set().union(*rows)
    except TypeError:  # a row that is not iterable: inference names it
        return None
    numeric = {*schema.dense, *schema.labels}
    fields = []
    for name in sorted(names, key=str):
        if name in numeric:
            fields.append(pa.field(name, pa.float64()))
            continue
        if name not in schema.slots:
            return None
        value = next(
            (
                r.get(name)
                for r in rows[:_GUESS_ROWS]
                if isinstance(r, dict) and r.get(name) is not None
            ),
            None,
        )
        kind = {str: pa.string(), int: pa.int64(), list: pa.list_(pa.int64())}.get(type(value))
        if kind is None:
            return None
        fields.append(pa.field(name, kind))
    try:
        return pa.array(rows, type=pa.struct(fields))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None


def _check_rows(rows: int, max_rows: int) -> None:
    if rows > max_rows:
        raise RequestError(
            413, f"rows: {rows} rows in one request; the limit is {max_rows} (--max-rows)"
        )


def _arrow_message(exc: Exception) -> str:
    if isinstance(exc, OverflowError):
        return "an integer does not fit int64 (JSON ids must be < 2**63; send uint64 as Arrow)"
    return f"values of mixed or unsupported types ({exc})"


def _row_problem(rows: list, exc: Exception) -> str:
    """Which row or column made ``pa.array`` fail (the error path: a loop is fine here)."""
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            return f"rows[{i}]: expected an object (column: value), got {type(row).__name__}"
    for name in sorted(set().union(*rows)):
        try:
            pa.array([row.get(name) for row in rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as column_exc:
            return f"rows[*].{name}: {_arrow_message(column_exc)}"
    return f"rows: not convertible to columns ({exc})"


def batch_from_table(table: pa.Table, schema: Schema, *, max_rows: int) -> Batch:
    """The batch of a request table (see the module docstring for the columns).

    Raises:
        RequestError: 400 naming the column, or 413 for more than ``max_rows`` rows.
    """
    _check_rows(table.num_rows, max_rows)
    if table.num_rows == 0:
        raise RequestError(400, "rows: the request holds no rows")
    known = {*schema.labels, *schema.dense, *schema.slots}
    unknown = [name for name in table.column_names if name not in known]
    if unknown:
        raise RequestError(
            400,
            f"{unknown[0]}: not a column of the request schema (unknown: {unknown}; dense: "
            f"{list(schema.dense)}, slots: {list(schema.slots)})",
        )
    n = table.num_rows
    names = set(table.column_names)
    dense = np.zeros((n, schema.num_dense), np.float64)
    for j, name in enumerate(schema.dense):
        if name in names:
            dense[:, j] = _dense_column(table.column(name).combine_chunks(), name)
    slots = {
        name: _slot(table.column(name).combine_chunks(), name)
        if name in names
        else Slot(np.empty(0, np.uint64), np.zeros(n + 1, np.int64))
        for name in schema.slots
    }
    return Batch(
        np.zeros(n, np.float32),
        transform_dense(dense, schema.dense_transform),
        slots,
        np.arange(n, dtype=np.int64),
    )


def _dense_column(column: pa.Array, name: str) -> np.ndarray:
    kind = column.type
    if not (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_string(kind)
        or pa.types.is_null(kind)
    ):
        raise RequestError(400, f"{name}: a dense column must hold numbers, got {kind}")
    values, _, bad = float_column(column)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise RequestError(
            400, f"{name}: row {row} holds {column[row].as_py()!r}, not a finite number"
        )
    return values


def _slot(column: pa.Array, name: str) -> Slot:
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return string_slot(column, name, None)
    if pa.types.is_integer(kind):
        ids = integer_ids(column.fill_null(0).to_numpy(zero_copy_only=False))
        return slot_from_ids(ids, column.is_valid().to_numpy(zero_copy_only=False), None)
    if pa.types.is_null(kind):
        return Slot(np.empty(0, np.uint64), np.zeros(len(column) + 1, np.int64))
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
        pa.types.is_integer(kind.value_type) or pa.types.is_null(kind.value_type)
    ):
        return list_slot(column, None)
    raise RequestError(
        400,
        f"{name}: a slot column must hold strings (hashed), integer ids or lists of "
        f"integer ids, got {kind}",
    )


def criteo_request_rows(path: str | Path, count: int | None = None) -> list[dict]:
    """The first ``count`` rows (None: all) of a Criteo TSV file as ``/predict`` JSON rows
    (``{column: value}``, the label left out, an empty field null): what a client sends."""
    rows: list[dict] = []
    with open(path) as lines:
        for line in lines:
            if count is not None and len(rows) == count:
                break
            row: dict = {}
            for name, value in zip(CRITEO.columns(), line.rstrip("\n").split("\t"), strict=True):
                if name in CRITEO.dense:
                    row[name] = int(value) if value else None
                elif name in CRITEO.slots:
                    row[name] = value or None
            rows.append(row)
    return rows
