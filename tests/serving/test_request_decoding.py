"""Request decoding in process (no service): compressed Arrow bodies decode to what the
uncompressed ones do, a damaged stream is a 400 whatever byte is damaged, and the limits
on rows, feature ids and decoded bytes hold for every body shape.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from sparseps.data.schema import CRITEO
from sparseps.serving.arrow_header import batch_header
from sparseps.serving.request_columns import SMALL_ROWS
from sparseps.serving.requests import ARROW_STREAM, RequestError, batch_from_body, checked_batch

JSON = "application/json"


def arrow_body(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=40)
    return sink.getvalue().to_pybytes()


def request_table(rows: int = 100, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = pa.array(rng.integers(0, 2**63, 3 * rows, dtype=np.uint64))
    offsets = pa.array(np.arange(0, 3 * rows + 1, 3, dtype=np.int32))
    return pa.table(
        {
            "I1": pa.array(np.where(rng.random(rows) < 0.2, np.nan, rng.random(rows) * 100)),
            "I2": pa.array(rng.integers(0, 50, rows)),
            "C1": pa.array([f"{v:08x}" if v % 5 else None for v in rng.integers(0, 2**32, rows)]),
            "C2": pa.ListArray.from_arrays(offsets, ids),
            "C3": pa.array(rng.integers(-(2**62), 2**62, rows)),
        }
    ).replace_schema_metadata(None)


def same_batch(a, b) -> None:
    np.testing.assert_array_equal(a.dense, b.dense)
    assert a.slots.keys() == b.slots.keys()
    for name in a.slots:
        np.testing.assert_array_equal(a.slots[name].values, b.slots[name].values)
        np.testing.assert_array_equal(a.slots[name].offsets, b.slots[name].offsets)


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compressed_bodies_decode_as_uncompressed_ones(compression):
    table = request_table().drop_columns(["I1"])  # NaN is refused: not a finite number
    plain = batch_from_body(arrow_body(table), ARROW_STREAM, CRITEO, max_rows=1000)
    packed = arrow_body(table, compression)
    got = batch_from_body(packed, ARROW_STREAM, CRITEO, max_rows=1000)
    same_batch(got, plain)
    assert got.slots["C2"].values.size == 300 and got.slots["C1"].values.size > 50


def test_the_header_gives_what_a_batch_decodes_to():
    table = request_table(40).drop_columns(["I1"])
    for compression in (None, "zstd"):
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(arrow_body(table, compression)))
        reader.read_next_message()  # the schema
        message = reader.read_next_message()
        header = batch_header(message)
        batch = pa.ipc.read_record_batch(message, table.schema)
        assert header.rows == 40
        # arrays in schema order: I2, C1, C2 (lists), C2 (values), C3
        assert header.nodes[:, 0].tolist() == [40, 40, 40, 120, 40]
        assert header.nodes[1, 1] == batch.column("C1").null_count
        # every buffer, padded to 8 bytes; at least the arrays' own bytes
        assert batch.nbytes <= header.decoded_bytes <= batch.nbytes + 8 * 16


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_damaged_stream_is_a_400_whatever_byte_is_damaged(compression):
    """Each byte of a small stream altered in turn: a 400 (or, where the byte did not
    matter, an answer) and never another exception."""
    table = request_table(20).drop_columns(["I1"])
    body = arrow_body(table, compression)
    good = batch_from_body(body, ARROW_STREAM, CRITEO, max_rows=1000)
    refused = 0
    for position in range(len(body)):
        for value in (0x00, 0xFF, body[position] ^ 0x40):
            damaged = bytearray(body)
            damaged[position] = value
            try:
                batch = batch_from_body(bytes(damaged), ARROW_STREAM, CRITEO, max_rows=1000)
            except RequestError as exc:
                assert exc.status in (400, 413), (position, exc)
                refused += 1
                continue
            assert len(batch) == len(good)
    assert refused > len(body)  # most damage is seen


def test_rows_ids_and_bytes_limits_for_each_shape():
    table = request_table(100).drop_columns(["I1"])
    arrow = arrow_body(table, "zstd")
    rows = [{"I2": 1, "C2": [1, 2, 3], "C1": "a"}] * 100
    bodies = {
        "arrow": (arrow, ARROW_STREAM),
        "rows": (json.dumps({"rows": rows}).encode(), JSON),
        "columns": (
            json.dumps({"columns": {k: [r[k] for r in rows] for k in rows[0]}}).encode(),
            JSON,
        ),
    }
    for name, (body, kind) in bodies.items():
        # C2's lists, then one per non-null C1 (and C3)
        ids = 400 if name != "arrow" else 300 + 100 + 100 - table.column("C1").null_count
        assert len(batch_from_body(body, kind, CRITEO, max_rows=100, max_ids=600)) == 100
        with pytest.raises(RequestError, match="^rows: ") as too_many:
            batch_from_body(body, kind, CRITEO, max_rows=99)
        assert too_many.value.status == 413
        with pytest.raises(RequestError, match="^ids: ") as too_many:
            batch_from_body(body, kind, CRITEO, max_rows=100, max_ids=ids - 1)
        assert too_many.value.status == 413, name
    with pytest.raises(RequestError, match="^body: decodes to") as too_big:
        batch_from_body(arrow, ARROW_STREAM, CRITEO, max_rows=100, max_decoded_bytes=1024)
    assert too_big.value.status == 413


def test_json_rows_are_counted_while_parsing():
    body = ("{" + '"rows": [' + ",".join(["{}"] * 5000) + "]}").encode()
    with pytest.raises(RequestError, match=r"^rows: more than 100 rows") as refused:
        batch_from_body(body, JSON, CRITEO, max_rows=100)
    assert refused.value.status == 413


def test_integers_past_float64_precision_are_dense_values():
    """An int64 beyond 2**53 is rounded to float64 (then float32), not an error."""
    big = 2**60
    arrow = arrow_body(pa.table({"I2": pa.array([big, 3], pa.int64())}))
    for body, kind in ((arrow, ARROW_STREAM), (json.dumps({"rows": [{"I2": big}]}).encode(), JSON)):
        batch = batch_from_body(body, kind, CRITEO, max_rows=10)
        assert batch.dense[0, 1] == np.log1p(np.float32(big))  # the float32 transform


ONE_ROWS = [  # one-row JSON requests: each converts through the cached struct of its shape
    {"I1": 3, "I2": None, "C1": "68fd1e64", "C2": None, "C3": 7},
    {"I1": 3.5, "C1": None, "C2": [1, 2, 3], "C3": -5},
    {"C1": "68fd1e64"},
    {"I1": "4", "C1": "a"},  # numeric text: no guess fits, inference converts it
]


@pytest.mark.parametrize("row", ONE_ROWS)
def test_a_one_row_request_converts_as_its_columns_do(row):
    """The 1-row path (a struct type cached per column names and value types) gives the
    batch the columns body gives (pyarrow's inference, column by column), each time."""
    by_columns = batch_from_body(
        json.dumps({"columns": {k: [v] for k, v in row.items()}}).encode(), JSON, CRITEO,
        max_rows=10,
    )  # fmt: skip
    for _ in range(2):  # the second from the cache
        same_batch(batch_from_body(json.dumps({"rows": [row]}).encode(), JSON, CRITEO,
                                   max_rows=10), by_columns)  # fmt: skip
    # and as the same row among others (the many-row path guesses from the first rows)
    many = batch_from_body(json.dumps({"rows": [row, row]}).encode(), JSON, CRITEO, max_rows=10)
    np.testing.assert_array_equal(many.dense[0], by_columns.dense[0])


def test_a_refused_shape_is_refused_every_time():
    """The column checks are cached per shape; a refusal is not: it raises each time."""
    body = json.dumps({"rows": [{"I1": 1, "C1": 2.5}]}).encode()  # a float slot value
    for _ in range(2):
        with pytest.raises(RequestError, match="C1: a slot column") as refused:
            batch_from_body(body, JSON, CRITEO, max_rows=10)
        assert refused.value.status == 400
    table = pa.table({"I1": [1.0], "C1": pa.array([1.5])})
    for _ in range(2):
        with pytest.raises(RequestError, match="C1: a slot column"):
            batch_from_body(arrow_body(table), ARROW_STREAM, CRITEO, max_rows=10)


def mixed_table(rows: int, seed: int) -> pa.Table:
    """Every column type a small table converts value by value: float and integer dense
    values (nulls, past 2**53, float32), string slots (nulls, empty strings: no id),
    signed and unsigned integer ids (negative: the uint64 of the same bits), a slot null
    in every row, a label (ignored); and absent columns."""
    rng = np.random.default_rng(seed)
    words = ["68fd1e64", "", None, "80e26c9b", "é~ü", "0" * 40]  # 40: XXH64's long path
    return pa.table(
        {
            "label": pa.array(rng.integers(0, 2, rows)),
            "I1": pa.array([None if v < 0.2 else v * 1e3 for v in rng.random(rows)]),
            "I2": pa.array(rng.integers(-(2**62), 2**62, rows)),
            "I3": pa.array(rng.random(rows), pa.float32()),
            "I4": pa.array([None] * rows, pa.null()),
            "C1": pa.array([words[i] for i in rng.integers(0, len(words), rows)]),
            "C2": pa.array(rng.integers(-(2**63), 2**63, rows, dtype=np.int64)),
            "C3": pa.array(rng.integers(2**63, 2**64, rows, dtype=np.uint64)),
            "C4": pa.array([None if v < 0.5 else int(v * 100) for v in rng.random(rows)]),
            "C5": pa.array([None] * rows, pa.null()),
            "C6": pa.array(
                [words[i] for i in rng.integers(0, len(words), rows)], pa.large_string()
            ),
        }
    )


@pytest.mark.parametrize("seed", range(3))
def test_a_small_table_converts_as_a_large_one_does(seed):
    """Tables of at most SMALL_ROWS rows convert value by value, larger ones column by
    column (pyarrow, the compiled hash): each row of a small table gets the batch row it
    gets inside a large one, bit for bit."""
    big = mixed_table(3 * SMALL_ROWS, seed)
    whole = checked_batch(big, CRITEO)
    for start, rows in ((0, 1), (1, 2), (5, 7), (17, SMALL_ROWS), (2 * SMALL_ROWS, SMALL_ROWS)):
        small = checked_batch(big.slice(start, rows), CRITEO)
        np.testing.assert_array_equal(small.dense, whole.dense[start : start + rows])
        assert small.dense.dtype == whole.dense.dtype and small.dense.flags.c_contiguous
        for name in CRITEO.slots:
            part = whole.slots[name].slice(start, start + rows)
            np.testing.assert_array_equal(small.slots[name].values, part.values, err_msg=name)
            np.testing.assert_array_equal(small.slots[name].offsets, part.offsets, err_msg=name)
            assert small.slots[name].values.dtype == np.uint64
            assert small.slots[name].offsets.dtype == np.int64
    assert whole.slots["C1"].values.size > 0 and whole.slots["C5"].values.size == 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), r"^I1: row 1 holds nan, not a finite number"),
        (float("inf"), r"^I1: row 1 holds inf, not a finite number"),
        (1e39, r"^I1: row 1 holds 1e\+39, beyond float32"),
    ],
)
def test_a_small_table_refuses_a_dense_value_as_a_large_one(value, message):
    for rows in (2, 3 * SMALL_ROWS):
        table = pa.table({"I1": pa.array([1.0, value] + [2.0] * (rows - 2))})
        with pytest.raises(RequestError, match=message) as refused:
            checked_batch(table, CRITEO)
        assert refused.value.status == 400
