"""Delimited text: Criteo TSV (no header, columns by position) and CSV with a header.

Criteo TSV, one sample per line, 40 tab-separated fields (schema
:data:`~sparseps.data.schema.CRITEO`)::

    0<TAB><TAB>3<TAB>260<TAB>...<TAB>05db9164<TAB>08d6d899<TAB>...<TAB><TAB>

- field 1 is the label; fields 2..14 are ``I1..I13`` and 15..40 are ``C1..C26``; a
  schema with ``extra_labels`` has them right after the label (``click``, ``conversion``,
  then the dense and slot columns: :meth:`~sparseps.data.schema.Schema.columns`);
- an empty dense field is missing (feature 0); dense values go through the schema's
  :class:`~sparseps.data.schema.DenseTransform` (``log(1 + max(x, 0))`` for Criteo);
- an empty categorical field gives the sample no id in that slot; any other value
  becomes ``xxh64(value, seed=xxh64(slot name))`` (:mod:`sparseps.data.hashing`).

CSV with a header (``label,I1,...,C26`` as in DeepCTR's ``criteo_sample.txt``, or
Avazu's ``id,click,hour,...``) takes the schema's columns by name from the header and
ignores the others; it is otherwise read the same way.

A line with the wrong number of fields, a missing label (or extra label), or a label or
dense value that is not a finite number is a bad line. Blank lines (and lines of empty fields) are skipped
and not counted.

Two parsers apply these rules: unquoted text (all of Criteo TSV) goes through one
compiled pass over the bytes (:mod:`sparseps.data.fast_delimited`); text with ``"``
quotes goes through pyarrow's CSV reader (every column as text, so one bad value costs
one line, not the chunk) plus whole-column casts and the compiled hash. Neither runs
Python code per line; a test checks that they agree.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from ..errors import InputError
from .columns import Parsed, float_column, string_slot, transform_dense
from .fast_delimited import parse_unquoted
from .schema import Batch, Schema, extra_label_array, sample_id

__all__ = ["header_names", "parse_delimited", "parse_with_arrow"]


def header_names(line: bytes, delimiter: str, schema: Schema, path: str) -> tuple[str, ...]:
    """The column names of a header line; checks that the schema's columns are there.

    Raises:
        InputError: a schema column is missing from the header.
    """
    names = tuple(
        n.strip().strip('"') for n in line.decode("utf-8").rstrip("\r\n").split(delimiter)
    )
    wanted = [*schema.labels, *dict.fromkeys(schema.dense), *schema.slots]
    missing = [n for n in wanted if n not in names]
    if missing:
        raise InputError(
            f"{path}:1: header lacks the schema's columns {', '.join(missing)} "
            f"(header: {', '.join(names)}); use a schema whose names match the header"
        )
    return names


def parse_delimited(data: bytes, schema: Schema, names: tuple[str, ...], delimiter: str, *,
                    first_line: int, file_no: int, first_record: int,
                    max_examples: int = 5) -> Parsed:  # fmt: skip
    """Parse a chunk of whole lines of delimited text (no header inside).

    Args:
        data: the bytes of whole lines.
        schema: which columns are label, dense and slots.
        names: the names of the file's columns, in order (the header, or the schema's
            columns for headerless Criteo TSV).
        delimiter: the field separator.
        first_line: the file's line number of the chunk's first line (1-based).
        file_no: the file's number in the job (for sample ids).
        first_record: how many samples of this file came before this chunk.
        max_examples: how many bad lines to describe.

    Text without a ``"`` goes through the compiled single pass
    (:mod:`sparseps.data.fast_delimited`); text with quotes through pyarrow's CSV reader.
    Both apply the same rules.
    """
    parse = parse_unquoted if b'"' not in data else parse_with_arrow
    return parse(
        data, schema, names, delimiter, first_line=first_line, file_no=file_no,
        first_record=first_record, max_examples=max_examples,
    )  # fmt: skip


def parse_with_arrow(data: bytes, schema: Schema, names: tuple[str, ...], delimiter: str, *,
                     first_line: int, file_no: int, first_record: int,
                     max_examples: int = 5) -> Parsed:  # fmt: skip
    """The general path (quoted fields allowed): pyarrow's CSV reader, then whole columns."""
    short: list[tuple[int, str]] = []

    def on_invalid(row) -> str:  # called by arrow for bad lines only, never per good line
        short.append(
            (row.number, f"expected {row.expected_columns} fields, got {row.actual_columns}")
        )
        return "skip"

    wanted = list(dict.fromkeys([*schema.labels, *schema.dense, *schema.slots]))
    table = pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(
            use_threads=False, column_names=list(names), block_size=max(len(data) + 1, 1 << 20)
        ),
        parse_options=pacsv.ParseOptions(
            delimiter=delimiter, invalid_row_handler=on_invalid, ignore_empty_lines=False
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(wanted, pa.string()),
            include_columns=wanted,
            null_values=[""],  # only an empty field is missing ("NA", "nan" are values)
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        ),
    )
    columns = {name: table.column(name).combine_chunks() for name in wanted}
    label_col = columns[schema.label]
    label, has_label, bad_label = float_column(label_col)
    blank = ~has_label
    if blank.any():
        # a row with no label is a blank line only when it has no value at all
        for name in wanted[1:]:
            blank &= ~columns[name].is_valid().to_numpy(zero_copy_only=False)
    bad = (~has_label & ~blank) | bad_label
    dense = np.zeros((len(table), schema.num_dense), np.float64)
    reasons = [
        ("no label", ~has_label & ~blank, None),
        ("label is not a finite number", bad_label, schema.label),
    ]
    extra = np.zeros((len(table), len(schema.extra_labels)), np.float64)
    for k, name in enumerate(schema.extra_labels):
        extra[:, k], present, bad_values = float_column(columns[name])
        missing = ~present & ~blank
        bad |= missing | bad_values
        reasons.append((f"no label {name}", missing, None))
        reasons.append((f"label {name} is not a finite number", bad_values, name))
    for j, name in enumerate(schema.dense):
        values, _, bad_values = float_column(columns[name])
        dense[:, j] = values
        if bad_values.any():
            bad |= bad_values
            reasons.append((f"{name} is not a finite number", bad_values, name))
    keep = ~(bad | blank)
    rows = int(keep.sum())
    all_kept = rows == len(table)
    batch = Batch(
        label[keep].astype(np.float32) if not all_kept else label.astype(np.float32),
        transform_dense(dense if all_kept else dense[keep], schema.dense_transform),
        {n: string_slot(columns[n], n, None if all_kept else keep) for n in schema.slots},
        sample_id(file_no, np.arange(first_record, first_record + rows)),
        extra_label_array(schema, extra if all_kept else extra[keep]),
    )
    examples = _examples(bad, reasons, columns, short, first_line, max_examples)
    # with ignore_empty_lines=False every line is a table row or an invalid row
    return Parsed(batch, int(bad.sum()) + len(short), examples, lines=len(table) + len(short))


def _examples(bad, reasons, columns, short, first_line, max_examples) -> list[tuple[int, str]]:
    """``(file line, reason)`` of the first bad lines, in line order."""
    # arrow's handler numbers lines from 1 within the chunk; table rows skip those lines
    skipped = np.array(sorted(n for n, _ in short), np.int64)
    examples = [(first_line + n - 1, reason) for n, reason in short]
    rows = np.flatnonzero(bad)[:max_examples]
    if rows.size:
        # chunk line of table row k: k + 1 + (number of skipped lines before it)
        shifted = skipped - np.arange(skipped.size)
        lines = rows + 1 + np.searchsorted(shifted, rows + 1, side="right")
        for row, line in zip(rows, lines, strict=True):
            reason, name = next((text, name) for text, mask, name in reasons if mask[row])
            if name is not None:
                reason = f"{reason} ({columns[name][int(row)].as_py()!r})"
            examples.append((first_line + int(line) - 1, reason))
    return sorted(examples)[:max_examples]
