"""A ``POST /predict`` body -> a :class:`sparseps.data.Batch`, validated at the boundary.

Three body shapes, all turned into one Arrow table, then into a batch column by column
(pyarrow and numpy; no Python loop over rows)::

    JSON rows      {"rows": [{"I1": 3, "I2": null, "C1": "68fd1e64", ...}, ...]}
    JSON columns   {"columns": {"I1": [3, 0], "C1": ["68fd1e64", "a1"], ...}}
    Arrow          Content-Type: application/vnd.apache.arrow.stream (an IPC stream)

Columns are those of the request schema (the model's, or ``sparseps serve --schema``):
its dense columns (numbers or numeric text; null or absent = missing, then the schema's
dense transform; a name the schema repeats ``k`` times, as PaddleRec's ``dense_feature``,
is one column of lists of ``k`` numbers) and its slots, one of: a string (hashed with the slot, exactly as the
data files are), an integer id, or a list of integer ids (JSON integers must be below
2**63; a negative one is the uint64 with the same bits; use Arrow ``uint64`` for any id).
A column the schema does not name is refused, except its label columns, which are
ignored; an absent column is missing in every row; a column named twice is refused.
Every refusal is a :class:`RequestError` whose message names the field.

Work is bounded before it is done (:class:`RequestLimits`): an Arrow stream is read one
record batch at a time, and each batch's rows, feature ids and decoded (decompressed)
bytes are read from its header (:mod:`.arrow_body`) and added to the request's before
the batch is decoded; a JSON body counts its objects (rows) while it is parsed. Feature
ids of any body are counted again, column by column, before they are hashed or looked up.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import orjson
import pyarrow as pa

from ..data.schema import CRITEO, Batch, Schema
from .arrow_body import arrow_table
from .limits import RequestError, RequestLimits, check_rows
from .request_columns import batch_from_table, check_table, checked_batch

__all__ = [
    "ARROW_STREAM", "RequestError", "RequestLimits", "batch_from_body", "batch_from_table",
    "checked_batch", "criteo_request_rows", "table_from_body",
]  # fmt: skip

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def batch_from_body(
    body: bytes,
    content_type: str,
    schema: Schema,
    *,
    max_rows: int,
    max_ids: int = RequestLimits.ids,
    max_decoded_bytes: int = RequestLimits.decoded_bytes,
) -> Batch:
    """Parse and validate one request body, within limits (:class:`RequestLimits`).

    Raises:
        RequestError: 400 (malformed, naming the field), 413 (more than ``max_rows``
            rows, ``max_ids`` feature ids or ``max_decoded_bytes`` decoded), 415 (a
            content type other than JSON or Arrow).
    """
    table = table_from_body(
        body,
        content_type,
        schema,
        max_rows=max_rows,
        max_ids=max_ids,
        max_decoded_bytes=max_decoded_bytes,
    )
    return checked_batch(table, schema)


def table_from_body(
    body: bytes,
    content_type: str,
    schema: Schema,
    *,
    max_rows: int,
    max_ids: int = RequestLimits.ids,
    max_decoded_bytes: int = RequestLimits.decoded_bytes,
) -> pa.Table:
    """A request body as an Arrow table, checked but for its values (rows, ids, names,
    types: :func:`~.request_columns.check_table`); :func:`checked_batch` converts it, or
    several requests' tables concatenated (the service's batching, :mod:`.batcher`).

    Raises:
        RequestError: as :func:`batch_from_body`.
    """
    limits = RequestLimits(max_rows, max_ids, max_decoded_bytes)
    kind = content_type.split(";")[0].strip().lower()
    if kind == ARROW_STREAM:
        table = arrow_table(body, schema, limits)
    elif kind in ("application/json", ""):
        table = _json_table(body, max_rows, schema)
    else:
        raise RequestError(415, f"Content-Type: {kind!r} is not application/json or {ARROW_STREAM}")
    check_table(table, schema, max_rows=max_rows, max_ids=max_ids)
    return table


class _TooManyObjects(Exception):
    """Raised from the JSON parser's object hook: more objects than rows allowed."""


def _json_table(body: bytes, max_rows: int, schema: Schema) -> pa.Table:
    objects = 0

    def count(obj: dict) -> dict:  # rows are objects: count them while parsing
        nonlocal objects
        objects += 1
        if objects > max_rows + 2:  # the body's object, its "columns" object, the rows
            raise _TooManyObjects
        return obj

    payload = _fast_json(body, max_rows)
    try:
        if payload is None:
            payload = json.loads(body, object_hook=count)
    except _TooManyObjects:
        raise RequestError(
            413,
            f"rows: more than {max_rows} rows (JSON objects); the limit is {max_rows} (--max-rows)",
        ) from None
    except RecursionError:
        raise RequestError(400, "body: JSON nested too deeply (a request nests 4 levels)") from None
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
        check_rows(len(rows), max_rows)
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
    check_rows(next(iter(lengths.values()), 0), max_rows)
    arrays = {}
    for name, values in columns.items():
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RequestError(400, f"columns.{name}: {_arrow_message(exc)}") from None
    return pa.table(arrays)


_LONG_NUMBER = re.compile(rb"[0-9]{20}")


def _fast_json(body: bytes, max_rows: int) -> object | None:
    """``body`` parsed by orjson (3-10x faster than ``json``), or None to parse it with
    ``json`` instead: when the body may hold more objects than ``max_rows`` rows allow
    (orjson has no object hook to stop it early; each object opens with a ``{``, so
    counting them bounds the objects), when it holds a number of 20 digits or more (orjson
    reads an integer past 64 bits as a float, where ``json`` keeps it an integer, refused
    by name) or when orjson refuses it. ``json`` then parses it as before, so every
    refusal keeps its message (depth, NaN, integers past 64 bits)."""
    if body.count(b"{") > max_rows + 2 or _LONG_NUMBER.search(body):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


_GUESS_ROWS = 8  # rows looked at to guess a slot column's type
_SLOT = None  # a column's role in _roles: a slot (its type guessed from its values)
# a slot value's Python type -> its column's Arrow type; null in every row looked at: the
# null type, as inference gives an all-null column (a value in a later row fails the
# conversion, and inference runs)
_SLOT_TYPES = {str: pa.string(), int: pa.int64(), list: pa.list_(pa.int64()),
               type(None): pa.null()}  # fmt: skip


@functools.lru_cache(maxsize=16)
def _roles(schema: Schema) -> dict[str, pa.DataType | None]:
    """Each request column's Arrow type (a repeated dense name: a list of numbers; dense
    and label columns: float64), or ``_SLOT`` for a slot."""
    roles: dict[str, pa.DataType | None] = {name: _SLOT for name in schema.slots}
    roles.update({name: pa.float64() for name in (*schema.dense, *schema.labels)})
    roles.update({name: pa.list_(pa.float64()) for name in schema.dense
                  if schema.dense.count(name) > 1})  # fmt: skip
    return roles


def _typed_rows(rows: list, schema: Schema) -> pa.StructArray | None:
    """``rows`` converted with a guessed type, or None to convert them with inference.

    Inference costs pyarrow about 0.7 ms even for one row (it tries to import optional
    modules on every call); with a type the conversion of a 1-row request takes 10 µs.
    Dense and label columns are float64; a slot column's type comes from its first
    non-null value in the first rows. A wrong guess (a numeric text, mixed types, a
    non-object row) fails and falls back to inference, which finds the error. The struct
    type is made once per set of columns and value types (cached): for a 1-row request,
    looking at its 39 columns one by one cost more than the rest of its parse.
    """
    if len(rows) == 1 and type(rows[0]) is dict:
        row = rows[0]
        struct = _struct(tuple(row), tuple(map(type, row.values())), schema)
    else:
        try:
            names = sorted(set().union(*rows), key=str)
        except TypeError:  # a row that is not iterable: inference names it
            return None
        head = [r for r in rows[:_GUESS_ROWS] if isinstance(r, dict)]
        first = [next((type(v) for r in head if (v := r.get(name)) is not None), type(None))
                 for name in names]  # fmt: skip
        struct = _struct(tuple(names), tuple(first), schema)
    if struct is None:
        return None
    try:
        return pa.array(rows, type=struct)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _struct(names: tuple, kinds: tuple[type, ...], schema: Schema) -> pa.StructType | None:
    """The struct of columns ``names`` whose (first non-null) values are of Python types
    ``kinds``: by the schema's role of each (:func:`_roles`), a slot's by its values' type;
    None where no type is guessed (a column the schema lacks, a value of another type)."""
    roles = _roles(schema)
    fields = []
    for name, kind in sorted(zip(names, kinds, strict=True), key=lambda c: str(c[0])):
        role = roles.get(name, _SLOT)
        if role is _SLOT:
            role = _SLOT_TYPES.get(kind) if name in roles else None
            if role is None:
                return None
        fields.append(pa.field(name, role))
    return pa.struct(fields)


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
