"""The slot text format (PaddleRec): one sample per line, ``key:value`` tokens.

Worked example (schema :data:`~sparseps.data.schema.CRITEO_SLOT`, 3 dense shown)::

    click:1 dense_feature:0.0 dense_feature:0.93 dense_feature:0.02 1:715353 2:761523 2:5

- ``click:1`` is the label (any finite number; required). Each of the schema's
  ``extra_labels`` is a key read the same way (``click:1 conversion:0 ...``: required,
  once per line) into ``Batch.extra_labels``.
- the k-th ``dense_feature:x`` of the line fills the k-th dense column named
  ``dense_feature``; a line must carry every dense column of the schema.
- ``2:761523`` adds the id 761523 to slot ``2``: ids are unsigned decimal integers, used
  as the uint64 feature id unchanged (the producer already hashed them). A slot may
  repeat (``2:761523 2:5`` gives sample ids ``[761523, 5]``) or be absent (no ids).
- tokens are separated by spaces or tabs; keys not in the schema are ignored; blank
  lines are skipped and not counted.

Bad lines (a token without ``:``, a label or dense value that is not a finite number, an
id that is not an unsigned 64-bit integer, a missing label, too few or too many dense
values) are reported with their line number and reason and left out of the batch.

The whole chunk is parsed by one compiled pass over its bytes (:func:`_parse`: each byte
is read once, except a dense value's, which is found then parsed), then a compiled
counting sort groups the ids by slot: no Python code runs per line or per token.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit
from .columns import Parsed, good_rows_batch
from .hashing import xxh64_bytes, xxh64_range
from .numbers import POW10
from .schema import Schema, Slot
from .slot_tokens import ends_token, read_id, read_number, same_bytes, token_end

__all__ = ["parse_slot_text"]

_KIND_LABEL, _KIND_DENSE, _KIND_SLOT, _KIND_EXTRA = 0, 1, 2, 3
_OK, _BLANK = 0, -1
_REASONS = {
    1: "token {token!r} has no ':'",
    2: "label {token!r} is not a finite number",
    3: "dense value {token!r} is not a finite number",
    4: "id {token!r} is not an unsigned 64-bit integer",
    5: "no label ({label!r}) on the line",
    6: "wrong number of {name!r} values (the schema has {expected})",
    7: "label {token!r} appears twice",
    8: "no label ({name!r}) on the line",
}


@njit(nogil=True, cache=True)
def _parse(data, key_hash, small_keys, key_kind, key_index, dense_start, dense_count,
           dense_cols, pow10, status, err_start, err_end, label, dense, tok_row, tok_slot,
           tok_val, extra):  # fmt: skip
    """Parse every line of ``data``; returns (lines, tokens) written to the outputs.

    One pass over the bytes: each token's key is read (and looked up) up to its ``:``,
    its value parsed up to the token's end; a line ends at its newline. An id is
    recorded with its good row's number (the good lines before its line): the ids of a
    bad or blank line are dropped when its end is reached.
    """
    n = data.size
    counts = np.zeros(dense_start.size, np.int64)
    seen = np.zeros(extra.shape[1], np.bool_)  # extra labels found on the line
    line = 0
    row = 0
    ntok = 0
    pos = 0
    # the last key found by hashing: a line repeats its non-numeric keys (dense_feature
    # 13 times in Criteo), so comparing the next token's bytes with it first spares most
    # hashes and the scan for the ':'
    last_s, last_width, last_k = 0, -1, -1
    while pos < n:
        counts[:] = 0
        seen[:] = False
        has_label = False
        code = _OK
        first_tok = ntok
        any_token = False
        i = pos
        while i < n and data[i] != 10:
            if ends_token(data, i, n):  # a separator (or the \r of \r\n)
                i += 1
                continue
            any_token = True
            s = i
            colon = s + last_width
            if (
                last_width > 0
                and colon < n
                and data[colon] == 58
                and same_bytes(data, s, last_s, last_width)
            ):
                k = last_k  # the key hashed last (its bytes hold no ':' and no separator)
            else:
                number = 0
                digits = True
                while not ends_token(data, i, n) and data[i] != 58:
                    c = data[i]
                    if 48 <= c <= 57:
                        if i - s < 5:
                            number = number * 10 + (c - 48)
                    else:
                        digits = False
                    i += 1
                    if i == n:
                        break
                if i == n or data[i] != 58:
                    code, err_start[line], err_end[line] = 1, s, i
                    break
                colon = i
                width = colon - s
                if digits and 0 < width <= 4 and (width == 1 or data[s] != 48):
                    k = small_keys[number]  # slot keys are usually small numbers: no hash
                else:
                    h = xxh64_range(data, s, colon, np.uint64(0))
                    k = np.searchsorted(key_hash, h)
                    if k >= key_hash.size or key_hash[k] != h:
                        k = -1
                    last_s, last_width, last_k = s, width, k
            if k < 0:
                i = token_end(data, colon + 1, n)
                continue  # a key the schema does not use
            kind = key_kind[k]
            if kind == _KIND_SLOT:
                ok, v, i = read_id(data, colon + 1, n)
                if not ok:
                    code, err_start[line], err_end[line] = 4, s, i
                    break
                tok_row[ntok] = row
                tok_slot[ntok] = key_index[k]
                tok_val[ntok] = v
                ntok += 1
                continue
            ok, x, i = read_number(data, colon + 1, n, pow10)
            if kind == _KIND_DENSE:
                g = key_index[k]
                if not ok:
                    code, err_start[line], err_end[line] = 3, s, i
                    break
                if counts[g] >= dense_count[g]:
                    code, err_start[line], err_end[line] = 6, g, g
                    break
                dense[line, dense_cols[dense_start[g] + counts[g]]] = x
                counts[g] += 1
            elif kind == _KIND_EXTRA:
                j = key_index[k]
                if not ok:
                    code, err_start[line], err_end[line] = 2, s, i
                    break
                if seen[j]:
                    code, err_start[line], err_end[line] = 7, s, i
                    break
                seen[j] = True
                extra[line, j] = x
            else:
                if not ok:
                    code, err_start[line], err_end[line] = 2, s, i
                    break
                if has_label:
                    code, err_start[line], err_end[line] = 7, s, i
                    break
                has_label = True
                label[line] = x
        if code != _OK:  # a bad line: its other tokens are not read
            while i < n and data[i] != 10:
                i += 1
        if code == _OK:
            if not any_token:
                code = _BLANK
            elif not has_label:
                code = 5
            else:
                for j in range(seen.size):
                    if not seen[j]:
                        code, err_start[line] = 8, j
                        break
            if code == _OK:
                for g in range(dense_start.size):
                    if counts[g] != dense_count[g]:
                        code, err_start[line], err_end[line] = 6, g, g
                        break
        if code != _OK:
            ntok = first_tok  # drop the ids of a bad or blank line
        else:
            row += 1
        status[line] = code
        line += 1
        pos = i + 1
    return line, ntok


@njit(nogil=True, cache=True)
def _group_by_slot(tok_row, tok_slot, tok_val, num_slots, rows):
    """Ids in slot-major order, keeping their order within a slot (a counting sort).

    Returns:
        ``(values, offsets [num_slots, rows + 1], starts [num_slots + 1])``: slot ``s``
        holds ``values[starts[s]:starts[s + 1]]``, its sample ``r`` the ids
        ``offsets[s, r]:offsets[s, r + 1]`` of that slice.
    """
    offsets = np.zeros((num_slots, rows + 1), np.int64)
    for t in range(tok_slot.size):
        offsets[tok_slot[t], tok_row[t] + 1] += 1
    starts = np.zeros(num_slots + 1, np.int64)
    for s in range(num_slots):
        run = 0
        for r in range(1, rows + 1):
            run += offsets[s, r]
            offsets[s, r] = run
        starts[s + 1] = starts[s] + run
    cursor = starts[:num_slots].copy()
    values = np.empty(tok_slot.size, np.uint64)
    for t in range(tok_slot.size):
        s = tok_slot[t]
        values[cursor[s]] = tok_val[t]
        cursor[s] += 1
    return values, offsets, starts


class _Keys:
    """The schema's keys, looked up inside the kernel by their XXH64 (sorted)."""

    def __init__(self, schema: Schema):
        groups = list(dict.fromkeys(schema.dense))
        entries = [(schema.label, _KIND_LABEL, 0)]
        entries += [(name, _KIND_DENSE, g) for g, name in enumerate(groups)]
        entries += [(name, _KIND_SLOT, s) for s, name in enumerate(schema.slots)]
        entries += [(name, _KIND_EXTRA, j) for j, name in enumerate(schema.extra_labels)]
        hashes = np.array([xxh64_bytes(n.encode()) for n, _, _ in entries], np.uint64)
        order = np.argsort(hashes)
        self.hash = hashes[order]
        self.kind = np.array([entries[i][1] for i in order], np.int8)
        self.index = np.array([entries[i][2] for i in order], np.int64)
        cols = [[c for c, n in enumerate(schema.dense) if n == name] for name in groups]
        self.dense_count = np.array([len(c) for c in cols], np.int64)
        self.dense_start = np.cumsum(self.dense_count) - self.dense_count
        self.dense_cols = np.array([c for group in cols for c in group], np.int64)
        self.groups = groups
        # canonical decimal keys below 10000 are found by value, without hashing
        self.small = np.full(10000, -1, np.int64)
        for k, i in enumerate(order):
            name = entries[i][0]
            if name.isdigit() and name.isascii() and len(name) <= 4 and str(int(name)) == name:
                self.small[int(name)] = k


_KEY_CACHE: dict[Schema, _Keys] = {}


def parse_slot_text(data: bytes, schema: Schema, *, first_line: int, file_no: int,
                    first_record: int, max_examples: int = 5) -> Parsed:  # fmt: skip
    """Parse a chunk of whole lines of the slot text format.

    Args:
        data: the bytes of whole lines (the last may lack its newline).
        schema: which keys are label, dense and slots.
        first_line: the file's line number of the chunk's first line (1-based).
        file_no: the file's number in the job (for sample ids).
        first_record: how many samples of this file came before this chunk.
        max_examples: how many bad lines to describe.

    Returns:
        the batch of good lines and the bad lines' count and first descriptions.
    """
    keys = _KEY_CACHE.get(schema)
    if keys is None:
        keys = _KEY_CACHE.setdefault(schema, _Keys(schema))
    buf = np.frombuffer(data, dtype=np.uint8)
    max_lines = int(np.count_nonzero(buf == 10)) + 1
    max_tokens = int(np.count_nonzero(buf == 58))  # every kept id has its ':'

    status = np.zeros(max_lines, np.int8)
    err_start = np.zeros(max_lines, np.int64)
    err_end = np.zeros(max_lines, np.int64)
    label = np.zeros(max_lines, np.float64)
    dense = np.zeros((max_lines, schema.num_dense), np.float64)
    tok_row = np.empty(max_tokens, np.int32)
    tok_slot = np.empty(max_tokens, np.int32)
    tok_val = np.empty(max_tokens, np.uint64)
    extra = np.zeros((max_lines, len(schema.extra_labels)), np.float64)
    lines, ntok = _parse(
        buf, keys.hash, keys.small, keys.kind, keys.index, keys.dense_start, keys.dense_count,
        keys.dense_cols, POW10, status, err_start, err_end, label, dense, tok_row, tok_slot,
        tok_val, extra,
    )  # fmt: skip
    status = status[:lines]
    ok = status == _OK
    rows = int(ok.sum())
    values, offsets, starts = _group_by_slot(
        tok_row[:ntok], tok_slot[:ntok], tok_val[:ntok], len(schema.slots), rows
    )
    slots = {
        name: Slot(values[starts[s] : starts[s + 1]], offsets[s])
        for s, name in enumerate(schema.slots)
    }
    batch = good_rows_batch(schema, (label, dense, extra), lines, ok, slots, file_no, first_record)
    bad = np.flatnonzero(status > 0)
    examples = []
    for line in bad[:max_examples]:
        code = int(status[line])
        group = keys.groups[int(err_start[line])] if code == 6 and keys.groups else ""
        if code == 8:
            group = schema.extra_labels[int(err_start[line])]
        token = data[err_start[line] : err_end[line]].decode("utf-8", "replace")
        reason = _REASONS[code].format(
            token=token, label=schema.label, name=group,
            expected=int(keys.dense_count[int(err_start[line])]) if code == 6 else 0,
        )  # fmt: skip
        examples.append((first_line + int(line), reason))
    return Parsed(batch, int(bad.size), examples, lines=int(lines))
