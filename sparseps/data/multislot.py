"""Paddle's multislot text: what ``MultiSlotDataGenerator`` (and the string variant) print.

One sample per line; for each slot, in a fixed order, the number of values and then the
values, all separated by spaces (or tabs). Worked example, a schema with label
``click``, one dense name ``dense`` of 3 columns and slots ``1``, ``2``, ``3``::

    1 1 3 0.0 0.93 0.02 1 715353 2 761523 5 0

reads as ``click = [1]``, ``dense = [0.0, 0.93, 0.02]``, slot ``1`` = ``[715353]``, slot
``2`` = ``[761523, 5]``, slot ``3`` = no id (count 0).

How the slots map onto a :class:`~sparseps.data.schema.Schema`:

- the order is ``schema.multislot_order`` (Paddle's ``set_use_var`` order, which is the
  order the generator yields its ``(name, values)`` pairs); by default the label, then
  the extra labels, then each distinct dense name, then the sparse slots;
- the label's slot holds exactly 1 value (a finite number), and so does the slot of each
  of the schema's ``extra_labels`` (ESMM's ``click`` and ``conversion``), read into
  ``Batch.extra_labels``;
- a dense name's slot holds exactly as many values as the schema has columns of that
  name (``dense_feature`` 13 times in :data:`~sparseps.data.CRITEO_SLOT` = one slot of 13
  values; Criteo's ``I1..I13`` = 13 slots of 1 value); they go through the schema's
  dense transform like every other format's dense values;
- a sparse slot holds any number of ids (0 = none; Paddle's padding id 0 is an id like
  any other). ``format="multislot"``: ids are unsigned 64-bit decimal integers used
  unchanged, as in the slot text format (ids of different slots are not separated:
  the producer chose them). ``format="multislot_string"`` (what
  ``MultiSlotStringDataGenerator`` prints): every id is a string hashed with its slot's
  seed exactly as CSV/TSV strings are (:mod:`sparseps.data.hashing`), so a generator that
  passes Criteo's hex strings through gives the same ids as reading the TSV;
- a name in ``multislot_order`` that is not in the schema is a slot whose values are
  skipped.

A bad line (a count that is not an integer, a wrong count for the label or a dense
name, a value that does not parse, a line that ends inside a slot or goes on after the
last one) is reported with its line number and reason and left out; blank lines are
skipped and not counted. Counts that do not fit are most often a schema whose slot order
is not the generator's, so those reasons say where the slot is in ``multislot_order``
(``'click' has 13 values, the schema has 1 (slot 1 of 28 in the default multislot_order:
...; pass it as Schema(multislot_order=(...)))``). One compiled pass over the chunk's bytes (:func:`_parse`)
does the work, then the ids are grouped by slot as in :mod:`sparseps.data.slot_text`:
no Python code runs per line or per value.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit
from .columns import Parsed, good_rows_batch
from .hashing import slot_seed, xxh64_range
from .numbers import POW10, parse_float, parse_uint64
from .schema import Schema, Slot
from .slot_text import _group_by_slot

__all__ = ["parse_multislot"]

_SKIP, _LABEL, _DENSE, _SLOT, _EXTRA = 0, 1, 2, 3, 4
_OK, _BLANK = 0, -1
_BAD_COUNT, _BAD_LABEL, _BAD_DENSE, _BAD_ID, _SHORT, _WRONG_COUNT, _TRAILING = 1, 2, 3, 4, 5, 6, 7
# a line whose counts do not fit is most often a schema whose slot order is not the
# generator's: those reasons say where the slot is in multislot_order ({where})
_REASONS = {
    _BAD_COUNT: "count {token!r} of slot {name!r} is not a non-negative integer{where}",
    _BAD_LABEL: "label {token!r} of {name!r} is not a finite number",
    _BAD_DENSE: "value {token!r} of {name!r} is not a finite number",
    _BAD_ID: "id {token!r} of slot {name!r} is not an unsigned 64-bit integer",
    _SHORT: "the line ends inside slot {name!r}{where}",
    _WRONG_COUNT: "{name!r} has {count} values, the schema has {expected}{where}",
    _TRAILING: "more tokens after the last slot {name!r} ({token!r}...){where}",
}
_DEFAULT_ORDER = (
    "the default multislot_order: label, extra labels, dense names, slots; if the generator "
    "yields another order, pass it as Schema(multislot_order=(...))"
)


@njit(nogil=True, cache=True, inline="always")
def _token(data, i, end):
    """The next token ``[s, e)`` at or after ``i`` (s == e == end: none left)."""
    while i < end and (data[i] == 32 or data[i] == 9):
        i += 1
    s = i
    while i < end and data[i] != 32 and data[i] != 9:
        i += 1
    return s, i


@njit(nogil=True, cache=True)
def _parse(data, kinds, index, expected, dense_start, dense_cols, seeds, hash_ids, pow10,
           status, err_s, err_e, err_g, err_n, label, dense, tok_line, tok_slot, tok_val,
           extra):  # fmt: skip
    """Parse every line of ``data``; returns (lines, ids) written to the outputs."""
    n = data.size
    groups = kinds.size
    line = 0
    ntok = 0
    pos = 0
    while pos < n:
        eol = pos
        while eol < n and data[eol] != 10:
            eol += 1
        end = eol
        if end > pos and data[end - 1] == 13:  # '\r\n'
            end -= 1
        code = _OK
        first_tok = ntok
        i = pos
        s, e = _token(data, i, end)
        if s == e:
            code = _BLANK
        g = 0
        while code == _OK and g < groups:
            s, e = _token(data, i, end)
            i = e
            if s == e:
                code, err_g[line] = _SHORT, g
                break
            ok, count = parse_uint64(data, s, e)
            if not ok or count > np.uint64(n):  # an absurd count cannot fit the chunk
                code, err_s[line], err_e[line], err_g[line] = _BAD_COUNT, s, e, g
                break
            count = np.int64(count)
            kind = kinds[g]
            want = expected[g]
            if want >= 0 and count != want:
                code, err_g[line], err_n[line] = _WRONG_COUNT, g, count
                break
            k = index[g]
            for v in range(count):
                s, e = _token(data, i, end)
                i = e
                if s == e:
                    code, err_g[line] = _SHORT, g
                    break
                if kind == _SLOT:
                    if hash_ids:
                        tok_val[ntok] = xxh64_range(data, s, e, seeds[k])
                    else:
                        ok, value = parse_uint64(data, s, e)
                        if not ok:
                            code, err_s[line], err_e[line], err_g[line] = _BAD_ID, s, e, g
                            break
                        tok_val[ntok] = value
                    tok_line[ntok] = line
                    tok_slot[ntok] = k
                    ntok += 1
                elif kind == _DENSE:
                    ok, x = parse_float(data, s, e, pow10)
                    if not ok:
                        code, err_s[line], err_e[line], err_g[line] = _BAD_DENSE, s, e, g
                        break
                    dense[line, dense_cols[dense_start[k] + v]] = x
                elif kind in (_LABEL, _EXTRA):
                    ok, x = parse_float(data, s, e, pow10)
                    if not ok:
                        code, err_s[line], err_e[line], err_g[line] = _BAD_LABEL, s, e, g
                        break
                    if kind == _LABEL:
                        label[line] = x
                    else:
                        extra[line, k] = x
            g += 1
        if code == _OK:
            s, e = _token(data, i, end)
            if s != e:
                code, err_s[line], err_e[line], err_g[line] = _TRAILING, s, e, groups - 1
        if code != _OK:
            ntok = first_tok  # drop the ids of a bad or blank line
        status[line] = code
        line += 1
        pos = eol + 1
    return line, ntok


class _Layout:
    """The schema's multislot slots as arrays the kernel reads."""

    def __init__(self, schema: Schema) -> None:
        groups = list(dict.fromkeys(schema.dense))
        cols = [[c for c, n in enumerate(schema.dense) if n == name] for name in groups]
        slots = {name: s for s, name in enumerate(schema.slots)}
        extra = {name: k for k, name in enumerate(schema.extra_labels)}
        self.names = schema.multislot_slots()
        self.order = "multislot_order" if schema.multislot_order is not None else _DEFAULT_ORDER
        n = len(self.names)
        self.kinds = np.zeros(n, np.int8)
        self.index = np.zeros(n, np.int64)
        self.expected = np.full(n, -1, np.int64)
        for g, name in enumerate(self.names):
            if name == schema.label:
                self.kinds[g], self.expected[g] = _LABEL, 1
            elif name in extra:
                self.kinds[g], self.index[g], self.expected[g] = _EXTRA, extra[name], 1
            elif name in groups:
                d = groups.index(name)
                self.kinds[g], self.index[g], self.expected[g] = _DENSE, d, len(cols[d])
            elif name in slots:
                self.kinds[g], self.index[g] = _SLOT, slots[name]
        counts = np.array([len(c) for c in cols], np.int64)
        self.dense_start = np.cumsum(counts) - counts
        self.dense_cols = np.array([c for group in cols for c in group], np.int64)
        self.seeds = np.array([slot_seed(name) for name in schema.slots] or [0], np.uint64)


_CACHE: dict[Schema, _Layout] = {}


def parse_multislot(data: bytes, schema: Schema, *, first_line: int, file_no: int,
                    first_record: int, hash_ids: bool = False,
                    max_examples: int = 5) -> Parsed:  # fmt: skip
    """Parse a chunk of whole lines of Paddle's multislot text.

    Args:
        data: the bytes of whole lines (the last may lack its newline).
        schema: label, dense and slots, and their order on the line (``multislot_order``).
        first_line: the file's line number of the chunk's first line (1-based).
        file_no: the file's number in the job (for sample ids).
        first_record: how many samples of this file came before this chunk.
        hash_ids: ids are strings to hash with the slot's seed (``multislot_string``)
            instead of decimal uint64 ids used unchanged.
        max_examples: how many bad lines to describe.
    """
    layout = _CACHE.get(schema)
    if layout is None:
        layout = _CACHE.setdefault(schema, _Layout(schema))
    buf = np.frombuffer(data, dtype=np.uint8)
    max_lines = int(np.count_nonzero(buf == 10)) + 1
    # every id is a token, and every token but a line's last is followed by a separator
    max_tokens = int(np.count_nonzero((buf == 32) | (buf == 9))) + max_lines
    status = np.zeros(max_lines, np.int8)
    err_s = np.zeros(max_lines, np.int64)
    err_e = np.zeros(max_lines, np.int64)
    err_g = np.zeros(max_lines, np.int64)
    err_n = np.zeros(max_lines, np.int64)
    label = np.zeros(max_lines, np.float64)
    dense = np.zeros((max_lines, schema.num_dense), np.float64)
    tok_line = np.empty(max_tokens, np.int64)
    tok_slot = np.empty(max_tokens, np.int64)
    tok_val = np.empty(max_tokens, np.uint64)
    extra = np.zeros((max_lines, len(schema.extra_labels)), np.float64)
    lines, ntok = _parse(
        buf, layout.kinds, layout.index, layout.expected, layout.dense_start, layout.dense_cols,
        layout.seeds, hash_ids, POW10, status, err_s, err_e, err_g, err_n, label, dense,
        tok_line, tok_slot, tok_val, extra,
    )  # fmt: skip
    status = status[:lines]
    ok = status == _OK
    rows = int(ok.sum())
    everything = rows == lines
    num_slots = len(schema.slots)
    tok_slot = tok_slot[:ntok]
    tok_row = tok_line[:ntok] if everything else (np.cumsum(ok) - 1)[tok_line[:ntok]]
    values, offsets, starts = _group_by_slot(tok_row, tok_slot, tok_val[:ntok], num_slots, rows)
    slots = {
        name: Slot(values[starts[s] : starts[s + 1]], offsets[s])
        for s, name in enumerate(schema.slots)
    }
    batch = good_rows_batch(schema, (label, dense, extra), lines, ok, slots, file_no, first_record)
    bad = np.flatnonzero(status > 0)
    examples = []
    for line in bad[:max_examples]:
        code, g = int(status[line]), int(err_g[line])
        reason = _REASONS[code].format(
            token=data[err_s[line] : err_e[line]].decode("utf-8", "replace")[:40],
            name=layout.names[g],
            count=int(err_n[line]), expected=int(layout.expected[g]),
            where=f" (slot {g + 1} of {len(layout.names)} in {layout.order})",
        )  # fmt: skip
        examples.append((first_line + int(line), reason))
    return Parsed(batch, int(bad.size), examples, lines=int(lines))
