"""Column conversions shared by the parsers: arrow columns -> label, dense, slots.

Everything here works on whole columns (pyarrow compute, numpy, the compiled hash); a
parser only decides which rows are bad and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .hashing import hash_string_array
from .schema import Batch, DenseTransform, Schema, Slot, extra_label_array, sample_id

__all__ = [
    "NUMBER_PATTERN",
    "Parsed",
    "float_column",
    "good_rows_batch",
    "integer_ids",
    "list_slot",
    "slot_from_ids",
    "transform_dense",
]

# What counts as a number in a text column: a strict subset of what arrow's cast accepts,
# so that after masking the non-matching values the cast cannot fail.
NUMBER_PATTERN = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


@dataclass
class Parsed:
    """One parsed chunk: the good samples, how many lines were bad, the first few why.

    ``examples`` holds ``(line, reason)`` pairs; ``line`` is the 1-based line of the file
    (for Parquet: the 1-based row).
    """

    batch: Batch
    bad: int = 0
    examples: list[tuple[int, str]] = field(default_factory=list)
    lines: int = 0  # lines of text consumed (good, bad and blank), for the next chunk's numbers
    bad_text: list[bytes] = field(default_factory=list)  # the first bad lines (format hints)


def good_rows_batch(
    schema: Schema,
    parsed: tuple[np.ndarray, np.ndarray, np.ndarray],
    lines: int,
    ok: np.ndarray,
    slots: dict[str, Slot],
    file_no: int,
    first_record: int,
) -> Batch:
    """The batch of a compiled parser's good lines.

    Args:
        parsed: the parser's ``(label, dense, extra)`` outputs, one row per line read.
        lines: lines read (rows of ``parsed`` that hold data).
        ok: bool ``[lines]``, the good lines (``slots`` already holds only theirs).
        first_record: record number of the first good row (names the samples).
    """
    label, dense, extra = (column[:lines] for column in parsed)
    if not ok.all():  # the common case needs no copy
        label, dense, extra = label[ok], dense[ok], extra[ok]
    rows = label.shape[0]
    return Batch(
        label.astype(np.float32),
        transform_dense(dense, schema.dense_transform),
        slots,
        sample_id(file_no, np.arange(first_record, first_record + rows)),
        extra_label_array(schema, extra),
    )


def transform_dense(values: np.ndarray, transform: DenseTransform) -> np.ndarray:
    """float32 C-contiguous ``[B, D]`` features from raw values (missing already 0)."""
    if transform is DenseTransform.LOG1P:
        out = np.maximum(values, 0).astype(np.float32)  # float32 log1p: half the memory traffic
        np.log1p(out, out=out)
        return out
    return np.ascontiguousarray(values, dtype=np.float32)


def float_column(column: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A text or numeric arrow column as float64.

    Returns:
        ``(values, present, bad)``: values with 0 where absent or bad, a mask of present
        values, and a mask of values that are not finite numbers (e.g. ``abc``, ``nan``).
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        try:
            numbers = pc.cast(column, pa.float64())
        except pa.ArrowInvalid:
            # rare path: find the offending values, null them, cast the rest
            good = pc.match_substring_regex(column, NUMBER_PATTERN)
            numbers = pc.cast(pc.if_else(good, column, None), pa.float64())
    else:
        numbers = pc.cast(column, pa.float64())
    present = column.is_valid().to_numpy(zero_copy_only=False)
    values = numbers.fill_null(0).to_numpy(zero_copy_only=False)
    finite = np.isfinite(values)
    bad = present & (~finite | ~numbers.is_valid().to_numpy(zero_copy_only=False))
    if not finite.all():
        values = np.where(finite, values, 0.0)
    return values, present, bad


def integer_ids(ints: np.ndarray) -> np.ndarray:
    """Integer ids as uint64; signed ones keep their bits (-1 -> 2**64 - 1)."""
    wide = ints.astype(np.uint64 if ints.dtype.kind == "u" else np.int64, copy=False)
    return wide.view(np.uint64)


def list_slot(column: pa.Array, keep: np.ndarray | None) -> Slot:
    """A slot of id lists (an Arrow list column of integers, or of nulls only): null
    lists and null ids give no id. ``keep`` (bool) drops rows first (bad lines)."""
    n = len(column)
    flat = pc.list_flatten(column)
    row = pc.list_parent_indices(column).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_null(flat.type):  # lists of nulls only: no id at all
        ids = np.zeros(len(flat), np.uint64)
    else:
        ids = integer_ids(flat.fill_null(0).to_numpy(zero_copy_only=False))
    if flat.null_count:
        valid = flat.is_valid().to_numpy(zero_copy_only=False)
        ids, row = ids[valid], row[valid]
    lengths = np.bincount(row, minlength=n)
    if keep is not None and not keep.all():
        ids, lengths = ids[keep[row]], lengths[keep]
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Slot(np.ascontiguousarray(ids, dtype=np.uint64), offsets)


def slot_from_ids(ids: np.ndarray, present: np.ndarray, keep: np.ndarray | None) -> Slot:
    """A one-id-per-sample slot: sample i has ``ids[i]`` if ``present[i]``, else nothing.

    ``keep`` (bool) drops rows first (the parser's bad lines).
    """
    if keep is not None:
        ids, present = ids[keep], present[keep]
    offsets = np.zeros(present.size + 1, np.int64)
    np.cumsum(present, out=offsets[1:])
    return Slot(np.ascontiguousarray(ids[present], dtype=np.uint64), offsets)


def string_slot(column: pa.Array, name: str, keep: np.ndarray | None) -> Slot:
    """A slot from a text column: each non-empty value hashed with the slot's seed."""
    ids, present = hash_string_array(column, name)
    return slot_from_ids(ids, present, keep)
