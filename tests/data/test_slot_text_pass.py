"""The slot text kernel's one-pass reading: what it shares between tokens and lines.

The kernel reads each byte once: a key is looked up as it is read (a non-numeric key is
compared with the last one it hashed before hashing again), an id is parsed as it is
read, a line ends at its newline (a ``\\r`` before it is a separator), and a decimal value
``-?digits.digits`` takes a fast path that must give the general parser's value bit for
bit. test_data_formats / test_data_bad_lines pin the format; these pin the shortcuts.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sparseps.data.numbers import POW10, parse_decimal, parse_float, parse_uint64
from sparseps.data.schema import Schema
from sparseps.data.slot_text import parse_slot_text
from sparseps.data.slot_tokens import read_id, read_number


def _parse(text: str, schema: Schema):
    return parse_slot_text(text.encode(), schema, first_line=1, file_no=0, first_record=0)


def _ids(parsed, slot: str) -> list[list[int]]:
    s = parsed.batch.slots[slot]
    return [s.values[s.offsets[i] : s.offsets[i + 1]].tolist() for i in range(len(s.offsets) - 1)]


def test_keys_of_one_width_are_told_apart_by_their_bytes():
    # "aa"/"ab"/"zz" (unknown) have one width: the remembered key must not be reused
    schema = Schema("lbl", ("aa", "ab"), ("s1", "s2"), dense_transform="raw")
    parsed = _parse("lbl:1 aa:1 ab:2 zz:9 s1:5 s2:6 s1:7\nab:4 lbl:0 zz:3 aa:3 s2:8\n", schema)
    assert parsed.bad == 0
    np.testing.assert_array_equal(parsed.batch.dense, [[1, 2], [3, 4]])
    assert _ids(parsed, "s1") == [[5, 7], []] and _ids(parsed, "s2") == [[6], [8]]


def test_carriage_returns_end_a_line_only_before_its_newline():
    schema = Schema("click", ("d",), ("1", "2"), dense_transform="raw")
    text = "click:1 d:2 1:3\r\nclick:0\td:1 2:4 \r\n\r\nclick:1 d:5 1:6\r"
    parsed = _parse(text, schema)
    assert (parsed.bad, parsed.lines, len(parsed.batch)) == (0, 4, 3)
    assert _ids(parsed, "1") == [[3], [], [6]] and _ids(parsed, "2") == [[], [4], []]
    # a \r inside a line is part of its token: here an id that is not a number
    bad = _parse("click:1 d:2 1:3\rx 2:4\n", schema)
    assert bad.bad == 1 and "'1:3\\rx'" in bad.examples[0][1]


def test_an_id_is_checked_as_it_is_read():
    schema = Schema("click", (), ("1",), dense_transform="raw")
    good = _parse("click:1 1:18446744073709551615 1:0 1:007\n", schema)
    assert _ids(good, "1") == [[2**64 - 1, 0, 7]]
    for value in ("18446744073709551616", "99999999999999999999", "", "1a", "a1", "1:2", "-1"):
        parsed = _parse(f"click:1 1:{value}\n", schema)
        assert parsed.bad == 1, value
        assert parsed.examples[0][1] == f"id '1:{value}' is not an unsigned 64-bit integer"


@njit
def _both(data, starts, ends, fast, general):
    for i in range(starts.size):
        ok, x = parse_float(data, starts[i], ends[i], POW10)
        ok2, y = parse_decimal(data, starts[i], ends[i], POW10)
        fast[i] = x if ok else np.nan
        general[i] = y if ok2 else np.nan


@njit
def _tokens(data, starts, ends, numbers, ids):
    """Each range read as a token (its end: the separator after it) and by the range
    parsers; ``numbers``/``ids`` [n, 2]: (token reader, range parser), nan / -1 if bad."""
    for i in range(starts.size):
        ok, x, end = read_number(data, starts[i], data.size, POW10)
        ok2, y = parse_float(data, starts[i], ends[i], POW10)
        numbers[i, 0] = x if ok and end == ends[i] else np.nan
        numbers[i, 1] = y if ok2 else np.nan
        ok, v, end = read_id(data, starts[i], data.size)
        ok2, w = parse_uint64(data, starts[i], ends[i])
        ids[i, 0] = v if ok and end == ends[i] else np.uint64(12345)
        ids[i, 1] = w if ok2 else np.uint64(12345)


def test_number_fast_paths_equal_the_general_parsers_bit_for_bit():
    rng = np.random.default_rng(7)
    texts = ["0.5", "-0.25", "0.0", "-0.0", "00012.5000", "1.", ".5", "-.5", "1.2.3", "-", "5-",
             "123456789012345.678", "12345678901234567.5", "1234567890123456.78", "0.6931",
             "-0", "-00000000000000000", "12345678901234567", "-1234567890123456", "1e5", "7",
             "18446744073709551615", "18446744073709551616", "0018446744073709551615",
             "99999999999999999999", "1234567890123456789", "12a", "--1"]  # fmt: skip
    for _ in range(20000):
        whole, frac = rng.integers(1, 19, 2)
        sign = "-" if rng.random() < 0.3 else ""
        texts.append(
            f"{sign}{rng.integers(0, 10 ** min(whole, 18))}.{'0' * rng.integers(0, 3)}"
            f"{rng.integers(0, 10 ** min(frac, 18))}"
        )
    texts += ["".join(map(str, rng.integers(0, 10, n))) for n in rng.integers(1, 23, 2000)]
    data = np.frombuffer("".join(texts).encode(), np.uint8)
    lengths = np.array([len(t) for t in texts])
    ends = np.cumsum(lengths)
    fast, general = np.empty(len(texts)), np.empty(len(texts))
    _both(data, ends - lengths, ends, fast, general)
    # bit for bit, but for the sign of zero: parse_float's integer path reads "-0" as 0.0
    # (as it always has), parse_decimal as -0.0
    negative_zero = np.array([t.lstrip("-0") == "" and t.startswith("-0") for t in texts])
    np.testing.assert_array_equal(fast[negative_zero], general[negative_zero])
    keep = ~negative_zero
    np.testing.assert_array_equal(fast[keep].view(np.int64), general[keep].view(np.int64))
    tokens = np.frombuffer(" ".join(texts).encode() + b"\r\n", np.uint8)
    token_starts = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
    numbers, ids = np.empty((len(texts), 2)), np.empty((len(texts), 2), np.uint64)
    _tokens(tokens, token_starts, token_starts + lengths, numbers, ids)
    np.testing.assert_array_equal(numbers[:, 0].view(np.int64), numbers[:, 1].view(np.int64))
    np.testing.assert_array_equal(ids[:, 0], ids[:, 1])
    assert np.isfinite(numbers[:, 0]).sum() > 20000 and (ids[:, 0] != 12345).sum() > 1500
    short = [i for i, t in enumerate(texts) if sum(c.isdigit() for c in t) <= 15 and t.count(".") == 1
             and t.lstrip("-")[:1].isdigit() and t[-1].isdigit()]  # fmt: skip
    assert [fast[i] for i in short] == [float(texts[i]) for i in short]  # correctly rounded
