"""The compiled fast path for unquoted delimited text (all of Criteo TSV in practice).

One pass over the bytes of a chunk splits lines and fields, parses the label and dense
numbers and hashes every categorical field in place (XXH64 with the slot's seed), so no
intermediate string column is ever built. It implements exactly the rules of
:mod:`sparseps.data.delimited` (which falls back to pyarrow's CSV reader for text with
quotes), and ``tests/data/test_data_formats.py`` checks that both paths agree.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit
from .columns import Parsed, good_rows_batch
from .hashing import slot_seed, xxh64_range
from .numbers import POW10, parse_float
from .schema import Schema, Slot

__all__ = ["parse_unquoted"]

_IGNORE, _LABEL, _DENSE, _SLOT, _EXTRA = 0, 1, 2, 3, 4
_OK, _BLANK, _FIELDS, _NO_LABEL, _BAD_LABEL, _BAD_DENSE, _NO_EXTRA = 0, -1, 1, 2, 3, 4, 5


@njit(nogil=True, cache=True)
def _parse(data, delimiter, col_kind, col_index, seeds, pow10,
           status, err_a, err_b, label, dense, ids, present, extra):  # fmt: skip
    """Parse every line in one pass over the bytes; returns the number of lines."""
    n = data.size
    ncols = col_kind.size
    line = 0
    pos = 0
    while pos < n:
        code = _OK
        has_value = False
        col = 0
        s = pos
        while True:
            e = s
            while e < n and data[e] != delimiter and data[e] != 10:
                e += 1
            last = e >= n or data[e] == 10
            f = e - 1 if last and e > s and data[e - 1] == 13 else e  # CRLF
            if col < ncols:
                kind = col_kind[col]
                if kind == _SLOT:
                    if f > s:
                        k = col_index[col]
                        ids[k, line] = xxh64_range(data, s, f, seeds[k])
                        present[k, line] = True
                        has_value = True
                elif kind == _DENSE:
                    if f > s:
                        has_value = True
                        ok, x = parse_float(data, s, f, pow10)
                        if ok:
                            dense[line, col_index[col]] = x
                        elif code == _OK:
                            code, err_a[line], err_b[line] = _BAD_DENSE, s, f
                elif kind == _LABEL:
                    if f == s:
                        if code == _OK:
                            code = _NO_LABEL
                    else:
                        has_value = True
                        ok, x = parse_float(data, s, f, pow10)
                        if ok:
                            label[line] = x
                        elif code == _OK:
                            code, err_a[line], err_b[line] = _BAD_LABEL, s, f
                elif kind == _EXTRA:  # an extra label column: the label's rules
                    if f == s:
                        if code == _OK:
                            code, err_a[line] = _NO_EXTRA, col
                    else:
                        has_value = True
                        ok, x = parse_float(data, s, f, pow10)
                        if ok:
                            extra[line, col_index[col]] = x
                        elif code == _OK:
                            code, err_a[line], err_b[line] = _BAD_LABEL, s, f
            col += 1
            if last:
                break
            s = e + 1
        if col == 1 and f == pos:
            code = _BLANK  # an empty line
        elif col != ncols:
            code, err_a[line] = _FIELDS, col
        elif (code in (_NO_LABEL, _NO_EXTRA)) and not has_value:
            code = _BLANK  # a line of empty fields is blank, as in the pyarrow path
        status[line] = code
        line += 1
        pos = e + 1
    return line


class _Columns:
    """What each column of the file is, as arrays the kernel reads."""

    def __init__(self, schema: Schema, names: tuple[str, ...]) -> None:
        dense = {name: j for j, name in enumerate(schema.dense)}
        slots = {name: s for s, name in enumerate(schema.slots)}
        extra = {name: k for k, name in enumerate(schema.extra_labels)}
        self.kind = np.zeros(len(names), np.int8)
        self.index = np.zeros(len(names), np.int64)
        self.names = names
        for c, name in enumerate(names):
            if name == schema.label:
                self.kind[c] = _LABEL
            elif name in extra:
                self.kind[c], self.index[c] = _EXTRA, extra[name]
            elif name in dense:
                self.kind[c], self.index[c] = _DENSE, dense[name]
            elif name in slots:
                self.kind[c], self.index[c] = _SLOT, slots[name]
        self.seeds = np.array([slot_seed(name) for name in schema.slots], np.uint64)
        self.dense_names = {c: name for c, name in enumerate(names) if name in dense}


_CACHE: dict[tuple[Schema, tuple[str, ...]], _Columns] = {}


def parse_unquoted(data: bytes, schema: Schema, names: tuple[str, ...], delimiter: str, *,
                   first_line: int, file_no: int, first_record: int,
                   max_examples: int = 5) -> Parsed:  # fmt: skip
    """Parse a chunk of whole lines of unquoted delimited text (arguments as in
    :func:`sparseps.data.delimited.parse_delimited`)."""
    columns = _CACHE.get((schema, names))
    if columns is None:
        columns = _CACHE.setdefault((schema, names), _Columns(schema, names))
    buf = np.frombuffer(data, np.uint8)
    cap = data.count(b"\n") + 1
    status = np.zeros(cap, np.int8)
    err_a = np.zeros(cap, np.int64)
    err_b = np.zeros(cap, np.int64)
    label = np.zeros(cap, np.float64)
    dense = np.zeros((cap, schema.num_dense), np.float64)
    ids = np.empty((len(schema.slots), cap), np.uint64)
    present = np.zeros((len(schema.slots), cap), np.bool_)
    extra = np.zeros((cap, len(schema.extra_labels)), np.float64)
    lines = _parse(
        buf, ord(delimiter), columns.kind, columns.index, columns.seeds, POW10,
        status, err_a, err_b, label, dense, ids, present, extra,
    )  # fmt: skip
    status = status[:lines]
    ok = status == _OK
    rows = int(ok.sum())
    everything = rows == lines
    slots = {}
    for s, name in enumerate(schema.slots):
        have = present[s, :lines]
        kept = have if everything else have & ok
        offsets = np.zeros(rows + 1, np.int64)
        np.cumsum(have if everything else have[ok], out=offsets[1:])
        slots[name] = Slot(ids[s, :lines][kept], offsets)
    batch = good_rows_batch(schema, (label, dense, extra), lines, ok, slots, file_no, first_record)
    bad = np.flatnonzero(status > 0)
    examples = []
    for line in bad[:max_examples]:
        code = int(status[line])
        text = data[err_a[line] : err_b[line]].decode("utf-8", "replace")
        if code == _FIELDS:
            reason = f"expected {len(names)} fields, got {int(err_a[line])}"
        elif code == _NO_LABEL:
            reason = "no label"
        elif code == _NO_EXTRA:
            reason = f"no label {names[int(err_a[line])]}"
        elif code == _BAD_LABEL:
            column = names[_column_of(data, int(err_a[line]), delimiter)]
            named = "" if column == schema.label else f" {column}"
            reason = f"label{named} is not a finite number ({text!r})"
        else:
            index = _column_of(data, int(err_a[line]), delimiter)
            reason = f"{names[index]} is not a finite number ({text!r})"
        examples.append((first_line + int(line), reason))
    return Parsed(batch, int(bad.size), examples, lines=int(lines))


def _column_of(data: bytes, position: int, delimiter: str) -> int:
    """Which field of its line the byte at ``position`` is in (for one error message)."""
    start = data.rfind(b"\n", 0, position) + 1
    return data.count(delimiter.encode(), start, position)
