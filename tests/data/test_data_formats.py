"""Every layout parses, checked field by field against values read by hand."""

import csv
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from sparseps.data import AVAZU, CRITEO, CRITEO_SLOT, Batch, QueueDataset, Schema, slot_seed
from sparseps.data.hashing import hash_string_array, xxh64_bytes
from sparseps.errors import InputError

# small published samples kept in the repository (tests/fixtures/README.md says where from)
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
CRITEO_CSV = os.path.join(DATA, "criteo_sample.csv")
SLOT_TXT = os.path.join(DATA, "criteo_slot_sample.txt")
AVAZU_CSV = os.path.join(DATA, "avazu_sample.csv")


def read_all(*args, **kwargs) -> Batch:
    kwargs.setdefault("max_bad_ratio", 1.0)  # parsing tests: bad lines are skipped, not fatal
    return Batch.concat(list(QueueDataset(*args, **kwargs)))


def cid(slot: str, value: str) -> int:
    """The documented feature id of a categorical value, computed with the xxhash package."""
    return xxhash.xxh64_intdigest(value.encode(), xxhash.xxh64_intdigest(slot.encode(), 0))


def ids_of(batch: Batch, slot: str, i: int) -> list[int]:
    s = batch.slots[slot]
    return s.values[s.offsets[i] : s.offsets[i + 1]].tolist()


def test_criteo_csv_with_header_field_by_field():
    b = read_all(CRITEO_CSV, CRITEO, batch_size=64, format="csv")
    assert len(b) == 200 and int(b.label.sum()) == 49
    # row 0: 0,,3,260.0,,17668.0,,,33.0,,,,0.0,,05db9164,...,e5ba7672,87c6f83c,,,0429f84b,,3a171ecb,c0d61a5c,,
    assert b.label[0] == 0.0
    assert b.dense[0, 0] == 0.0  # I1 missing -> 0
    assert b.dense[0, 1] == pytest.approx(math.log1p(3))  # I2 = 3
    assert b.dense[0, 2] == pytest.approx(math.log1p(260.0))  # I3 = 260.0
    assert b.dense[0, 4] == pytest.approx(math.log1p(17668.0), rel=1e-6)  # I5
    assert b.dense[1, 1] == 0.0  # row 1: I2 = -1 -> log(1 + max(-1, 0)) = 0
    assert ids_of(b, "C1", 0) == [cid("C1", "05db9164")]
    assert ids_of(b, "C18", 0) == [cid("C18", "87c6f83c")]
    assert ids_of(b, "C19", 0) == [] and ids_of(b, "C20", 0) == []  # missing -> no id
    assert ids_of(b, "C21", 0) == [cid("C21", "0429f84b")]
    assert ids_of(b, "C26", 0) == []
    # same string in two slots -> two different features
    assert cid("C1", "05db9164") != cid("C2", "05db9164")
    # layout contract
    assert b.dense.dtype == np.float32 and b.dense.flags.c_contiguous and b.dense.shape == (200, 13)
    for slot in b.slots.values():
        assert slot.values.dtype == np.uint64 and slot.offsets.dtype == np.int64
        assert slot.offsets[0] == 0 and slot.offsets[-1] == slot.values.size
    b.validate(CRITEO)


def test_criteo_csv_against_an_independent_reader():
    b = read_all(CRITEO_CSV, CRITEO, batch_size=1000, format="csv")
    with open(CRITEO_CSV) as f:
        rows = list(csv.DictReader(f))
    for j, name in enumerate(CRITEO.dense):
        want = [math.log1p(max(float(r[name]), 0)) if r[name] else 0.0 for r in rows]
        np.testing.assert_allclose(b.dense[:, j], want, rtol=1e-6, atol=1e-7)
    for name in CRITEO.slots:
        want = [[cid(name, r[name])] if r[name] else [] for r in rows]
        assert [ids_of(b, name, i) for i in range(len(rows))] == want


def test_raw_dense_transform_keeps_values():
    raw = Schema(CRITEO.label, CRITEO.dense, CRITEO.slots, dense_transform="raw")
    b = read_all(CRITEO_CSV, raw, batch_size=64, format="csv")
    assert b.dense[0, 1] == 3.0 and b.dense[0, 2] == 260.0 and b.dense[1, 1] == -1.0


def test_criteo_tsv_is_the_csv_without_header(tmp_path):
    with open(CRITEO_CSV) as f:
        lines = f.read().splitlines()[1:]
    path = tmp_path / "part.tsv"
    path.write_text("\n".join(line.replace(",", "\t") for line in lines) + "\n")
    tsv = read_all(str(path), CRITEO, batch_size=50)
    csv_ = read_all(CRITEO_CSV, CRITEO, batch_size=50, format="csv")
    np.testing.assert_array_equal(tsv.label, csv_.label)
    np.testing.assert_array_equal(tsv.dense, csv_.dense)
    for name in CRITEO.slots:
        np.testing.assert_array_equal(tsv.slots[name].values, csv_.slots[name].values)
        np.testing.assert_array_equal(tsv.slots[name].offsets, csv_.slots[name].offsets)


def test_slot_text_sample_field_by_field():
    b = read_all(SLOT_TXT, CRITEO_SLOT, batch_size=32, format="slot_text")
    assert len(b) == 80
    # line 1: click:0 dense_feature:0.0 dense_feature:0.00497512437811 ... 1:737395 ... 26:306163
    assert b.label[0] == 0.0 and b.label[1] == 1.0
    assert b.dense[0, 0] == 0.0
    assert b.dense[0, 1] == np.float32(0.00497512437811)
    assert b.dense[0, 4] == np.float32(0.207421875)
    assert b.dense[1, 1] == np.float32(0.932006633499)
    assert ids_of(b, "1", 0) == [737395] and ids_of(b, "26", 0) == [306163]
    assert ids_of(b, "2", 1) == [761523]
    with open(SLOT_TXT) as f:
        labels = [float(line.split()[0].split(":")[1]) for line in f]
    np.testing.assert_array_equal(b.label, labels)


def test_slot_text_repeated_and_absent_slots(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(
        "click:1 d:0.5 d:2 a:7 b:8 a:9\n"
        "\n"
        "click:0\td:1e-3\td:-4 extra:1 b:18446744073709551615 99:5 01:6\r\n"
        "d:1 d:2 click:1\n"
    )
    schema = Schema("click", ("d", "d"), ("a", "b", "1"), dense_transform="raw")
    b = read_all(str(path), schema, batch_size=10, format="slot_text")
    assert len(b) == 3
    assert b.slots["1"].values.size == 0  # "01" is not slot "1"; "99" and "extra" are ignored
    np.testing.assert_array_equal(b.label, [1, 0, 1])
    np.testing.assert_allclose(b.dense, [[0.5, 2], [1e-3, -4], [1, 2]])
    assert [ids_of(b, "a", i) for i in range(3)] == [[7, 9], [], []]
    assert [ids_of(b, "b", i) for i in range(3)] == [[8], [2**64 - 1], []]


def test_avazu_with_its_schema():
    b = read_all(AVAZU_CSV, AVAZU, batch_size=40, format="csv")
    with open(AVAZU_CSV) as f:
        rows = list(csv.DictReader(f))
    assert len(b) == len(rows) == 100
    np.testing.assert_array_equal(b.label, [float(r["click"]) for r in rows])
    assert b.dense.shape == (100, 0)
    assert ids_of(b, "site_id", 0) == [cid("site_id", "1fbe01fe")]
    assert ids_of(b, "C20", 0) == [cid("C20", "-1")]
    for name in AVAZU.slots:
        assert [ids_of(b, name, i) for i in range(100)] == [[cid(name, r[name])] for r in rows]


AVAZU_AWK = (
    'awk -F, \'NR > 1 { printf "click:%s", $2; n = split("4 5 15 16 17 18 19 20 21 22 23 24", c, " ");'
    ' for (k = 1; k <= n; k++) printf " %d:%d", c[k], $c[k] + 1; print "" }\''
)


def test_avazu_through_a_pipe_command():
    schema = Schema("click", (), tuple(str(c) for c in (4, 5, 15, 16, *range(17, 25))))
    b = read_all(AVAZU_CSV, schema, batch_size=30, pipe_command=AVAZU_AWK)
    with open(AVAZU_CSV) as f:
        rows = list(csv.reader(f))[1:]
    assert len(b) == 100
    np.testing.assert_array_equal(b.label, [float(r[1]) for r in rows])
    # column 23 (C20) holds -1 for some rows: the awk shifts every value by one
    assert [ids_of(b, "23", i) for i in range(100)] == [[int(r[22]) + 1] for r in rows]


def test_parquet_lists_ints_and_strings(tmp_path):
    table = pa.table(
        {
            "label": pa.array([1, 0, 1, None], pa.int8()),
            "price": pa.array([3.5, None, 0.0, 1.0]),
            "tags": pa.array([[7, 9], [], None, [1]], pa.list_(pa.uint64())),
            "neg": pa.array([[-1], [5, None, 6], [2], [3]], pa.list_(pa.int64())),
            "item": pa.array([11, None, 13, 14], pa.int64()),
            "user": pa.array(["u1", None, "", "u4"]),
        }
    )
    path = tmp_path / "x.parquet"
    pq.write_table(table, path)
    schema = Schema("label", ("price",), ("tags", "neg", "item", "user"))
    b = read_all(str(path), schema, batch_size=2, format="parquet")
    assert len(b) == 3  # the row without a label is bad
    np.testing.assert_array_equal(b.label, [1, 0, 1])
    np.testing.assert_allclose(b.dense[:, 0], np.log1p([3.5, 0, 0]), rtol=1e-6)
    assert [ids_of(b, "tags", i) for i in range(3)] == [[7, 9], [], []]
    assert [ids_of(b, "neg", i) for i in range(3)] == [[2**64 - 1], [5, 6], [2]]
    assert [ids_of(b, "item", i) for i in range(3)] == [[11], [], [13]]
    assert [ids_of(b, "user", i) for i in range(3)] == [[cid("user", "u1")], [], []]


def test_compiled_xxh64_is_bit_identical_to_the_xxhash_package():
    rng = np.random.default_rng(0)
    for length in [*range(0, 80), 100, 257, 1000]:
        for seed in (0, 1, 2**63 + 5, 2**64 - 1, int(rng.integers(0, 2**63))):
            data = rng.integers(0, 256, length, dtype=np.uint8).tobytes()
            assert xxh64_bytes(data, seed) == xxhash.xxh64_intdigest(data, seed), (length, seed)
    assert slot_seed("C1") == xxhash.xxh64_intdigest(b"C1", 0)


def test_hash_string_array_handles_slices_nulls_and_large_strings():
    values = ["05db9164", None, "", "x" * 40, "é"]
    for array in (pa.array(values), pa.array(values, pa.large_string())):
        for start in (0, 1):
            part = array.slice(start)
            ids, present = hash_string_array(part, "C7")
            want = values[start:]
            assert present.tolist() == [bool(v) for v in want]
            for got, v in zip(ids, want, strict=True):
                if v:
                    assert int(got) == cid("C7", v)


def _both_paths(data: bytes, schema, names, delimiter):
    from sparseps.data.delimited import parse_with_arrow
    from sparseps.data.fast_delimited import parse_unquoted

    kwargs = dict(first_line=10, file_no=2, first_record=5, max_examples=50)
    return (
        parse_unquoted(data, schema, names, delimiter, **kwargs),
        parse_with_arrow(data, schema, names, delimiter, **kwargs),
    )


def test_compiled_and_arrow_parsers_agree_on_good_and_bad_lines():
    with open(CRITEO_CSV, "rb") as f:
        header, *lines = f.read().splitlines()
    names = tuple(header.decode().split(","))
    odd = [
        b"1,2",  # too few fields
        lines[3] + b",extra",  # too many
        b"x" + lines[4][1:],  # bad label
        b"," + lines[5][2:],  # no label
        b",".join([*lines[6].split(b",")[:2], b"1e400", *lines[6].split(b",")[3:]]),  # I2 inf
        b"",  # blank
        b"," * 39,  # all fields empty: blank too
        b"+1.5e0" + lines[7][1:],  # an unusual but valid number
        lines[8] + b"\r",  # CRLF
    ]
    data = b"\n".join(lines[:40] + odd + lines[40:60]) + b"\n"
    fast, arrow = _both_paths(data, CRITEO, names, ",")
    assert fast.bad == arrow.bad == 5 and fast.lines == arrow.lines == 69
    assert fast.examples == arrow.examples
    for a, b in ((fast.batch, arrow.batch),):
        np.testing.assert_array_equal(a.label, b.label)
        np.testing.assert_array_equal(a.dense, b.dense)
        np.testing.assert_array_equal(a.ids, b.ids)
        for name in CRITEO.slots:
            np.testing.assert_array_equal(a.slots[name].values, b.slots[name].values)
            np.testing.assert_array_equal(a.slots[name].offsets, b.slots[name].offsets)
    assert len(fast.batch) == 62


def test_quoted_csv_goes_through_arrow(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('label,I1,C1\n1,"2","a,b"\n0,,"x"\n')
    schema = Schema("label", ("I1",), ("C1",), dense_transform="raw")
    b = read_all(str(path), schema, batch_size=4, format="csv")
    np.testing.assert_array_equal(b.dense[:, 0], [2, 0])
    assert ids_of(b, "C1", 0) == [cid("C1", "a,b")] and ids_of(b, "C1", 1) == [cid("C1", "x")]


def _same_batch(got: Batch, want: Batch) -> None:
    np.testing.assert_array_equal(got.label, want.label)
    np.testing.assert_array_equal(got.dense, want.dense)
    for name in want.slots:
        np.testing.assert_array_equal(got.slots[name].values, want.slots[name].values)
        np.testing.assert_array_equal(got.slots[name].offsets, want.slots[name].offsets)


@pytest.mark.parametrize("codec", ["gzip", "zstd", "bz2", "lz4"])
def test_compressed_files_are_read_as_they_are(tmp_path, codec):
    """By their first bytes, not their names (Criteo's logs ship as .gz), and a slot-text
    file as well as a CSV with its header."""
    for source, fmt in ((CRITEO_CSV, "csv"), (SLOT_TXT, "slot_text")):
        schema = CRITEO if fmt == "csv" else CRITEO_SLOT
        path = tmp_path / f"{fmt}-part"  # no extension
        with open(source, "rb") as f, pa.output_stream(str(path), compression=codec) as out:
            out.write(f.read())
        assert path.read_bytes()[:2] != Path(source).read_bytes()[:2]  # really compressed
        want = read_all(source, schema, batch_size=50, format=fmt)
        _same_batch(read_all(str(path), schema, batch_size=50, format=fmt), want)


# pyarrow reports its own failure to decode the binary line for our bad-line handler as an
# unraisable exception before it raises the error that we turn into InputError
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_truncated_or_binary_file_is_a_clear_error(tmp_path):
    with open(CRITEO_CSV, "rb") as f:
        lines = f.read().split(b"\n", 1)[1].replace(b",", b"\t")
    truncated = tmp_path / "part.gz"
    with pa.output_stream(str(truncated), compression="gzip") as out:
        out.write(lines)
    truncated.write_bytes(truncated.read_bytes()[:300])
    with pytest.raises(InputError, match=r"part.gz.*gzip stream is truncated or corrupt.*copy it"):
        read_all(str(truncated), CRITEO, batch_size=50)
    binary = tmp_path / "part.bin"
    binary.write_bytes(bytes(range(256)) * 40)
    with pytest.raises(InputError, match=r"part.bin', lines from 1: cannot be read as criteo_tsv"):
        read_all(str(binary), CRITEO, batch_size=50)
