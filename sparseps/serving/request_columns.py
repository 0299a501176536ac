"""A request's columns -> a :class:`sparseps.data.Batch`, each column checked.

Whatever the body's shape (:mod:`.requests`), it becomes an Arrow table whose columns are
checked here: names (known to the request schema, none twice), types (a dense column holds
numbers or numeric text, a slot strings, integer ids or lists of them, a label anything
flat: it is ignored), feature ids (within ``--max-ids``, counted per column before any is
hashed or looked up), dense values (finite in float32, the model's input type). The
conversion is columnar: pyarrow and numpy, no Python loop over rows.
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from ..data.columns import (
    float_column,
    integer_ids,
    list_slot,
    slot_from_ids,
    string_slot,
    transform_dense,
)
from ..data.hashing import slot_seed
from ..data.schema import Batch, Schema, Slot
from .limits import RequestError, RequestLimits, check_ids, check_rows

__all__ = [
    "FLOAT32_MAX", "batch_from_table", "check_names", "check_table", "check_type",
    "checked_batch", "dense_places", "is_list",
]  # fmt: skip

FLOAT32_MAX = float(np.finfo(np.float32).max)  # dense values reach the model as float32
_TYPE_TEXT = 80  # characters of an Arrow type shown in a message (nested types grow long)


def batch_from_table(
    table: pa.Table, schema: Schema, *, max_rows: int, max_ids: int = RequestLimits.ids
) -> Batch:
    """The batch of a request table (see the module docstring for the columns).

    Raises:
        RequestError: 400 naming the column, or 413 for more than ``max_rows`` rows or
            ``max_ids`` feature ids.
    """
    check_table(table, schema, max_rows=max_rows, max_ids=max_ids)
    return checked_batch(table, schema)


def check_table(table: pa.Table, schema: Schema, *, max_rows: int, max_ids: int) -> None:
    """What can be checked of a request table without converting its values: rows, names,
    types, feature ids (:func:`checked_batch` checks the values as it converts them).

    Raises:
        RequestError: as :func:`batch_from_table`.
    """
    check_rows(table.num_rows, max_rows)
    if table.num_rows == 0:
        raise RequestError(400, "rows: the request holds no rows")
    slots, lists = _checked_columns(table.schema, schema)
    # a slot column of strings or integers holds one id a row at most: counted only when
    # the bound could pass the limit (a small request's count cost 26 column reads)
    if lists or table.num_rows * len(slots) > max_ids:
        check_ids(sum(_ids_in(table.column(name)) for name in slots), max_ids)


@functools.lru_cache(maxsize=256)
def _checked_columns(columns: pa.Schema, schema: Schema) -> tuple[tuple[str, ...], bool]:
    """Checks a request table's names and types (:func:`check_names`,
    :func:`check_type`; a refusal raises and is not cached); returns its slot columns and
    whether one of them holds lists. Cached: a service's requests come in a few shapes, and
    checking 39 columns' types cost more than the rest of a 1-row request's parse."""
    check_names(columns.names, schema)
    for field in columns:
        check_type(field.name, field.type, schema)
    slots = tuple(name for name in columns.names if name in schema.slots)
    return slots, any(is_list(columns.field(name).type) for name in slots)


def checked_batch(table: pa.Table, schema: Schema) -> Batch:
    """The batch of a table :func:`check_table` passed (one request's, or several
    requests' concatenated: every conversion is row by row, so a row converts the same
    in either).

    Raises:
        RequestError: 400 for a value that does not convert, naming the column and row.
    """
    if table.num_rows <= SMALL_ROWS:
        small = _small_batch(table, schema)
        if small is not None:
            return small
    names = set(table.column_names)
    n = table.num_rows
    dense = np.zeros((n, schema.num_dense), np.float64)
    for name, places in dense_places(schema).items():
        if name not in names:
            continue
        column = table.column(name).combine_chunks()
        if len(places) == 1:
            dense[:, places[0]] = _dense_column(column, name)
        else:
            dense[:, places] = _dense_lists(column, name, len(places))
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


# Tables of at most this many rows are converted value by value (:func:`_small_batch`):
# a 1-row request's 39 Criteo columns cost ~0.85 ms of CPU column by column (a pyarrow or
# numba call or two each, for one value), ~0.14 ms as Python values; 32 rows (a call
# gathered at 64 clients) 1.0 ms against 0.3 ms, 64 rows 1.0 against 0.5 ms; at 128 rows
# the two are close.
SMALL_ROWS = 64
_UINT64 = (1 << 64) - 1


def _small_batch(table: pa.Table, schema: Schema) -> Batch | None:
    """The batch of a small table, value by value; the same values as the columnar
    conversion (tested against it). None when a column is of a type converted only by
    columns (numeric text, lists, ...) or a dense value is refused: the columnar
    conversion then converts it, or names the value it refuses."""
    plan = _small_plan(table.schema, schema)
    if plan is None:
        return None
    dense_at, string_slots, integer_slots = plan
    n = table.num_rows
    values = table.to_pydict()
    dense = np.zeros((n, schema.num_dense), np.float64)
    for name, place in dense_at:
        for row, value in enumerate(values[name]):
            if value is not None:
                dense[row, place] = value
    if not np.isfinite(dense).all() or (np.abs(dense) > FLOAT32_MAX).any():
        return None
    cells: list[int | None] = []  # slot by slot, row by row; None: no id
    for name in schema.slots:
        if name in string_slots:  # hashed as the data files are; null or empty: no id
            seed = string_slots[name]
            cells += [xxhash.xxh64_intdigest(v.encode(), seed) if v else None
                      for v in values[name]]  # fmt: skip
        elif name in integer_slots:  # the uint64 of the same bits
            cells += [None if v is None else v & _UINT64 for v in values[name]]
        else:  # absent, or null in every row
            cells += [None] * n
    present = np.array([cell is not None for cell in cells], bool).reshape(-1, n)
    ids = np.array([cell for cell in cells if cell is not None], np.uint64)
    offsets = np.zeros((len(schema.slots), n + 1), np.int64)
    np.cumsum(present, axis=1, out=offsets[:, 1:])
    ends = np.cumsum(offsets[:, -1]).tolist()
    slots = {
        name: Slot(ids[end - int(offsets[j, -1]) : end], offsets[j])
        for j, (name, end) in enumerate(zip(schema.slots, ends, strict=True))
    }
    return Batch(
        np.zeros(n, np.float32),
        transform_dense(dense, schema.dense_transform),
        slots,
        np.arange(n, dtype=np.int64),
    )


@functools.lru_cache(maxsize=256)
def _small_plan(
    columns: pa.Schema, schema: Schema
) -> tuple[tuple[tuple[str, int], ...], dict[str, int], frozenset[str]] | None:
    """For :func:`_small_batch`: the dense columns present and their place, the string
    slots present and their seeds, the integer slots present; None when a column's type
    is converted only by columns."""
    t = pa.types
    dense_at = []
    for name, places in dense_places(schema).items():
        if name not in columns.names:
            continue
        kind = columns.field(name).type
        if len(places) > 1 or not (t.is_floating(kind) or t.is_integer(kind) or t.is_null(kind)):
            return None
        dense_at.append((name, places[0]))
    strings, integers = {}, set()
    for name in schema.slots:
        if name not in columns.names:
            continue
        kind = columns.field(name).type
        if t.is_string(kind) or t.is_large_string(kind):
            strings[name] = slot_seed(name)
        elif t.is_integer(kind):
            integers.add(name)
        elif not t.is_null(kind):
            return None
    return tuple(dense_at), strings, frozenset(integers)


def dense_places(schema: Schema) -> dict[str, list[int]]:
    """Each distinct dense name and its columns in the dense features, in order: a name
    the schema repeats ``k`` times (PaddleRec's ``dense_feature``) is one request column of
    ``k`` numbers per row, the ``i``-th filling its ``i``-th place."""
    places: dict[str, list[int]] = {}
    for j, name in enumerate(schema.dense):
        places.setdefault(name, []).append(j)
    return places


def check_names(names: list[str], schema: Schema) -> None:
    """Refuse (400) a column the request schema does not name, or one named twice."""
    known = {*schema.labels, *schema.dense, *schema.slots}
    unknown = [name for name in names if name not in known]
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise RequestError(
            400,
            f"{unknown[0]}: not a column of the request schema (unknown: {unknown[:5]}{more}; "
            f"dense: {list(dense_places(schema))}, slots: {list(schema.slots)})",
        )
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise RequestError(
            400, f"{twice}: the column appears {names.count(twice)} times in the request"
        )


def is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _type_text(kind: pa.DataType) -> str:
    text = str(kind)
    return text if len(text) <= _TYPE_TEXT else text[: _TYPE_TEXT - 3] + "..."


def check_type(name: str, kind: pa.DataType, schema: Schema) -> None:
    """Refuse (400) a column whose type its role (dense, slot, label) cannot hold."""
    t = pa.types
    width = schema.dense.count(name)
    if width > 1:
        number = is_list(kind) and _numeric(kind.value_type)
        if not (number or t.is_null(kind)):
            raise RequestError(
                400,
                f"{name}: the model takes {width} dense values of this name, sent as a list "
                f"of {width} numbers per row; got {_type_text(kind)}",
            )
    elif name in schema.dense:
        if not _numeric(kind):
            raise RequestError(
                400, f"{name}: a dense column must hold numbers, got {_type_text(kind)}"
            )
    elif name in schema.slots:
        ids = is_list(kind) and (t.is_integer(kind.value_type) or t.is_null(kind.value_type))
        one = t.is_string(kind) or t.is_large_string(kind) or t.is_integer(kind)
        if not (ids or one or t.is_null(kind)):
            raise RequestError(
                400,
                f"{name}: a slot column must hold strings (hashed), integer ids or lists "
                f"of integer ids, got {_type_text(kind)}",
            )
    elif not (
        t.is_integer(kind) or t.is_floating(kind) or t.is_boolean(kind) or t.is_null(kind)
        or t.is_string(kind) or t.is_large_string(kind)
    ):  # fmt: skip
        raise RequestError(
            400, f"{name}: a label column (ignored) must hold numbers, got {_type_text(kind)}"
        )


def _numeric(kind: pa.DataType) -> bool:
    """A type a dense value may arrive in: a number, numeric text, or null."""
    t = pa.types
    return t.is_integer(kind) or t.is_floating(kind) or t.is_string(kind) or t.is_null(kind)


def _ids_in(column: pa.ChunkedArray) -> int:
    """Feature ids of a slot column: its non-null values, or the values of its lists."""
    if is_list(column.type):
        return int(pc.sum(pc.list_value_length(column)).as_py() or 0)
    return len(column) - column.null_count


def _dense_column(column: pa.Array, name: str) -> np.ndarray:
    if pa.types.is_integer(column.type):  # beyond 2**53 an integer is rounded, not refused
        column = pc.cast(column, pa.float64(), safe=False)
    values, _, bad = float_column(column)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise RequestError(
            400, f"{name}: row {row} holds {column[row].as_py()!r}, not a finite number"
        )
    beyond = np.abs(values) > FLOAT32_MAX  # finite in float64, infinite as the model's input
    if beyond.any():
        row = int(np.flatnonzero(beyond)[0])
        raise RequestError(
            400,
            f"{name}: row {row} holds {column[row].as_py()!r}, beyond float32 (the model's "
            f"input type; its largest value is {FLOAT32_MAX:.7g})",
        )
    return values


def _dense_lists(column: pa.Array, name: str, width: int) -> np.ndarray:
    """A column of lists of ``width`` numbers -> ``[rows, width]`` (a null row: zeros)."""
    rows = len(column)
    out = np.zeros((rows, width), np.float64)
    if pa.types.is_null(column.type):
        return out
    lengths = pc.list_value_length(column).fill_null(width).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != width)
    if wrong.size:
        row = int(wrong[0])
        raise RequestError(
            400,
            f"{name}: row {row} holds {int(lengths[row])} values; the model takes {width} "
            f"(a list of {width} numbers, or null)",
        )
    valid = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    flat = pc.list_flatten(column)
    if pa.types.is_integer(flat.type):  # as for one value: past 2**53 rounded, not refused
        flat = pc.cast(flat, pa.float64(), safe=False)
    values, _, bad = float_column(flat)
    beyond = np.abs(values) > FLOAT32_MAX
    if bad.any() or beyond.any():
        at = int(np.flatnonzero(bad | beyond)[0])
        row, value = int(valid[at // width]), flat[at].as_py()
        what = "not a finite number" if bad[at] else "beyond float32 (the model's input type)"
        raise RequestError(400, f"{name}: row {row} value {at % width} holds {value!r}, {what}")
    out[valid] = values.reshape(-1, width)
    return out


def _slot(column: pa.Array, name: str) -> Slot:
    """A slot column (its type already checked by :func:`check_type`) as a slot."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return string_slot(column, name, None)
    if pa.types.is_integer(kind):
        ids = integer_ids(column.fill_null(0).to_numpy(zero_copy_only=False))
        return slot_from_ids(ids, column.is_valid().to_numpy(zero_copy_only=False), None)
    if is_list(kind):
        return list_slot(column, None)
    return Slot(np.empty(0, np.uint64), np.zeros(len(column) + 1, np.int64))  # all null
