"""Schema.extra_labels: every format fills Batch.extra_labels, and shuffles carry it.

The same four samples written in each format read to the same label, extra labels and
ids; a missing or bad extra label is a bad line naming the column; InMemoryDataset's
local and global shuffles keep each sample's extra labels with it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from sparseps.data import CRITEO, Batch, InMemoryDataset, QueueDataset, Schema
from sparseps.data.schema import ID_FILE_SHIFT
from sparseps.data.shuffle import pack, unpack
from sparseps.data.sources import Format, parse_text
from sparseps.errors import ConfigError, InputError

SCHEMA = Schema("click", ("d",), ("u", "i"), extra_labels=("conv", "pay"), dense_transform="raw")
# click, conv, pay, d, u, i (u of the last sample missing)
ROWS = [
    ("1", "1", "0", "0.5", "7", "11"),
    ("0", "0", "0", "1.5", "8", "12"),
    ("1", "0", "1", "2.5", "9", "13"),
    ("1", "1", "1", "3.5", "", "14"),
]
LABEL = [1.0, 0.0, 1.0, 1.0]
EXTRA = [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
DENSE = [[0.5], [1.5], [2.5], [3.5]]


def hashed(slot: str, value: str) -> int:
    return xxhash.xxh64_intdigest(value.encode(), xxhash.xxh64_intdigest(slot.encode(), 0))


def ids(batch: Batch, slot: str) -> list[list[int]]:
    s = batch.slots[slot]
    return [s.values[s.offsets[k] : s.offsets[k + 1]].tolist() for k in range(len(batch))]


HASHED_U = [[hashed("u", r[4])] if r[4] else [] for r in ROWS]
HASHED_I = [[hashed("i", r[5])] for r in ROWS]
PLAIN_U = [[int(r[4])] if r[4] else [] for r in ROWS]
PLAIN_I = [[int(r[5])] for r in ROWS]


def multislot_line(row, order) -> str:
    values = dict(zip(("click", "conv", "pay", "d", "u", "i"), row, strict=True))
    return " ".join(f"1 {values[n]}" if values[n] else "0" for n in order)


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def tsv(tmp_path):
    return write(tmp_path / "a.tsv", "".join("\t".join(r) + "\n" for r in ROWS)), {}


def csv_unquoted(tmp_path):  # columns by name, in another order than the schema's
    order = (4, 2, 0, 3, 5, 1)
    head = ",".join(("click", "conv", "pay", "d", "u", "i")[c] for c in order)
    body = "".join(",".join(r[c] for c in order) + "\n" for r in ROWS)
    return write(tmp_path / "a.csv", head + "\n" + body), {"format": "csv"}


def csv_quoted(tmp_path):  # a quote sends the chunk through pyarrow's reader
    _, kwargs = csv_unquoted(tmp_path)
    text = (tmp_path / "a.csv").read_text().replace(",13,", ',"13",')
    return write(tmp_path / "q.csv", text), kwargs


def slot_text(tmp_path):
    lines = [
        f"click:{r[0]} u:{r[4]} conv:{r[1]} d:{r[3]} i:{r[5]} pay:{r[2]}".replace(" u: ", " ")
        for r in ROWS
    ]
    return write(tmp_path / "a.txt", "\n".join(lines) + "\n"), {"format": "slot_text"}


def parquet(tmp_path):
    table = pa.table({
        "click": pa.array([int(r[0]) for r in ROWS], pa.int8()),
        "conv": pa.array([float(r[1]) for r in ROWS]),
        "pay": pa.array([int(r[2]) for r in ROWS], pa.int64()),
        "d": pa.array([float(r[3]) for r in ROWS]),
        "u": pa.array([r[4] or None for r in ROWS]),
        "i": pa.array([r[5] for r in ROWS]),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "a.parquet")
    return str(tmp_path / "a.parquet"), {"format": "parquet"}


def multislot(tmp_path, fmt="multislot", order=("click", "conv", "pay", "d", "u", "i")):
    text = "".join(multislot_line(r, order) + "\n" for r in ROWS)
    return write(tmp_path / f"{fmt}.txt", text), {"format": fmt}


def multislot_string(tmp_path):
    return multislot(tmp_path, "multislot_string")


FORMATS = {
    "criteo_tsv": (tsv, HASHED_U, HASHED_I),
    "csv": (csv_unquoted, HASHED_U, HASHED_I),
    "csv_quoted": (csv_quoted, HASHED_U, HASHED_I),
    "slot_text": (slot_text, PLAIN_U, PLAIN_I),
    "parquet": (parquet, HASHED_U, HASHED_I),
    "multislot": (multislot, PLAIN_U, PLAIN_I),
    "multislot_string": (multislot_string, HASHED_U, HASHED_I),
}


def read_all(path, schema=SCHEMA, **kwargs) -> Batch:
    return Batch.concat(list(QueueDataset(path, schema, batch_size=3, **kwargs)))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_fills_extra_labels(tmp_path, name):
    make, want_u, want_i = FORMATS[name]
    path, kwargs = make(tmp_path)
    b = read_all(path, **kwargs)  # batches of 3: the second spans the chunk's end
    b.validate(SCHEMA)
    assert b.extra_labels.dtype == np.float32 and b.extra_labels.shape == (4, 2)
    assert b.extra_labels.tolist() == EXTRA and b.label.tolist() == LABEL
    assert b.dense.tolist() == DENSE
    assert ids(b, "u") == want_u and ids(b, "i") == want_i
    assert b.ids.tolist() == [0, 1, 2, 3]


def test_multislot_extra_labels_follow_multislot_order(tmp_path):
    order = ("u", "pay", "skipped", "click", "i", "d", "conv")
    schema = Schema("click", ("d",), ("u", "i"), extra_labels=("conv", "pay"),
                    dense_transform="raw", multislot_order=order)  # fmt: skip
    values = {"skipped": "5"}
    lines = []
    for r in ROWS:
        values.update(zip(("click", "conv", "pay", "d", "u", "i"), r, strict=True))
        lines.append(" ".join(f"1 {values[n]}" if values[n] else "0" for n in order))
    b = read_all(write(tmp_path / "m.txt", "\n".join(lines)), schema, format="multislot")
    assert b.extra_labels.tolist() == EXTRA and b.label.tolist() == LABEL
    assert ids(b, "u") == PLAIN_U and ids(b, "i") == PLAIN_I
    with pytest.raises(ConfigError, match="missing: pay"):
        Schema("click", ("d",), ("u", "i"), extra_labels=("conv", "pay"),
               multislot_order=("click", "conv", "d", "u", "i"))  # fmt: skip


def test_headerless_layout_puts_extra_labels_after_the_label():
    assert SCHEMA.columns() == ("click", "conv", "pay", "d", "u", "i")
    assert SCHEMA.multislot_slots() == ("click", "conv", "pay", "d", "u", "i")


GOOD_TSV = "1\t1\t0\t0.5\t7\t11\n"


@pytest.mark.parametrize(
    ("fmt", "good", "bad", "reason"),
    [
        ("criteo_tsv", GOOD_TSV, "1\t\t0\t0.5\t7\t11", "no label conv"),
        ("criteo_tsv", GOOD_TSV, "1\t1\tx\t0.5\t7\t11", "label pay is not a finite number ('x')"),
        ("criteo_tsv", GOOD_TSV, '1\t"1"\tnan\t0.5\t7\t11',
         "label pay is not a finite number ('nan')"),
        ("slot_text", "click:1 conv:1 pay:0 d:1\n", "click:1 conv:1 d:1",
         "no label ('pay') on the line"),
        ("slot_text", "click:1 conv:1 pay:0 d:1\n", "click:1 conv:1 pay:0 conv:0 d:1",
         "label 'conv:0' appears twice"),
        ("slot_text", "click:1 conv:1 pay:0 d:1\n", "click:1 conv:1 pay:-inf d:1",
         "label 'pay:-inf' is not a finite number"),
        ("multislot", "1 1 1 1 1 0 1 2 0 0\n", "1 1 2 1 0 1 0 1 2 0 0",
         "'conv' has 2 values, the schema has 1 (slot 2 of 6 in the default multislot_order: "
         "label, extra labels, dense names, slots; if the generator yields another order, "
         "pass it as Schema(multislot_order=(...)))"),
        ("multislot", "1 1 1 1 1 0 1 2 0 0\n", "1 1 1 1 1 y 1 2 0 0",
         "label 'y' of 'pay' is not a finite number"),
    ],
)  # fmt: skip
def test_a_missing_or_bad_extra_label_is_a_bad_line(fmt, good, bad, reason):
    parsed = parse_text((good + bad + "\n" + good).encode(), SCHEMA, Format(fmt))
    assert parsed.bad == 1 and len(parsed.batch) == 2
    assert parsed.examples[-1] == (2 + bad.count("\n"), reason)
    assert parsed.batch.extra_labels.tolist() == [[1.0, 0.0], [1.0, 0.0]]


def test_parquet_null_extra_label_is_a_bad_row(tmp_path):
    table = pa.table({"click": [1, 0, 1], "conv": [1.0, None, 0.0], "pay": [0, 1, 1],
                      "d": [1.0, 2.0, 3.0], "u": ["a", "b", "c"], "i": [1, 2, 3]})  # fmt: skip
    pq.write_table(table, tmp_path / "p.parquet")
    b = read_all(str(tmp_path / "p.parquet"), format="parquet", max_bad_ratio=1.0)
    assert b.label.tolist() == [1.0, 1.0] and b.extra_labels.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert b.ids.tolist() == [0, 1]


def test_fast_and_arrow_paths_agree_on_extra_labels():
    rows = [f"{r % 2}\t{(r * 7) % 3}\t{r % 5 / 4}\t{r}\tu{r}\ti{r % 9}" for r in range(500)]
    rows[17] = "1\t\t0\t1\tu\ti"  # no conv
    rows[90] = "1\t2\tzz\t1\tu\ti"  # bad pay
    text = "\n".join(rows).encode()
    fast = parse_text(text, SCHEMA, Format.CRITEO_TSV)
    arrow = parse_text(text.replace(b"u3\t", b'"u3"\t'), SCHEMA, Format.CRITEO_TSV)
    assert fast.bad == arrow.bad == 2 and fast.examples == arrow.examples
    np.testing.assert_array_equal(fast.batch.extra_labels, arrow.batch.extra_labels)
    kept = [r for r in range(500) if r not in (17, 90)]
    want = [[(r * 7) % 3, r % 5 / 4] for r in kept]
    np.testing.assert_array_equal(fast.batch.extra_labels, np.array(want, np.float32))


def test_no_extra_labels_means_none():
    plain = Schema("click", ("d",), ("u", "i"), dense_transform="raw")
    for fmt, text in ((Format.CRITEO_TSV, "1\t0.5\t7\t11\n"), (Format.SLOT_TEXT, "click:1 d:1\n"),
                      (Format.MULTISLOT, "1 1 1 2 0 0\n")):  # fmt: skip
        parsed = parse_text(text.encode(), plain, fmt)
        assert len(parsed.batch) == 1 and parsed.batch.extra_labels is None
    assert Batch.empty(plain).extra_labels is None
    assert Batch.empty(SCHEMA).extra_labels.shape == (0, 2)


def test_validate_checks_extra_labels():
    path_rows = "".join("\t".join(r) + "\n" for r in ROWS).encode()
    b = parse_text(path_rows, SCHEMA, Format.CRITEO_TSV).batch
    without = Batch(b.label, b.dense, b.slots, b.ids)
    with pytest.raises(InputError, match="the schema has 2 extra labels"):
        without.validate(SCHEMA)
    with pytest.raises(InputError, match=r"Batch.extra_labels: expected float32 \[4, K\]"):
        Batch(b.label, b.dense, b.slots, b.ids, b.extra_labels[:3]).validate()


def test_pack_round_trip_keeps_extra_labels():
    b = parse_text("".join("\t".join(r) + "\n" for r in ROWS).encode(), SCHEMA, Format.CRITEO_TSV)
    for batch in (b.batch, b.batch.slice(1, 3), b.batch.slice(0, 0)):
        back = unpack(pack(batch), list(batch.slots))
        np.testing.assert_array_equal(back.extra_labels, batch.extra_labels)
        np.testing.assert_array_equal(back.label, batch.label)
        np.testing.assert_array_equal(back.ids, batch.ids)
        assert ids(back, "u") == ids(batch, "u")
    plain = Batch(b.batch.label, b.batch.dense, b.batch.slots, b.batch.ids)
    assert unpack(pack(plain), ["u", "i"]).extra_labels is None


def _extra_files(folder, rows_per_file: list[int]) -> None:
    """TSV of the shuffle worker's EXTRA schema: label, conv = row % 5, then Criteo columns."""
    folder.mkdir(parents=True, exist_ok=True)
    for f, rows in enumerate(rows_per_file):
        lines = [
            "\t".join([str(r % 2), str(r % 5), *[str(r)] * 13, f"{f}-{r}", *["ab"] * 25])
            for r in range(rows)
        ]
        (folder / f"part-{f:05d}.tsv").write_text("".join(line + "\n" for line in lines))


def test_local_shuffle_keeps_extra_labels_with_their_sample(tmp_path):
    schema = Schema("label", CRITEO.dense, CRITEO.slots, extra_labels=("conv",))  # the worker's
    _extra_files(tmp_path / "d", [40, 30])
    ds = InMemoryDataset(str(tmp_path / "d"), schema, batch_size=16)
    ds.load_into_memory()
    ds.local_shuffle(seed=3)
    batches = list(ds)
    got_ids = np.concatenate([b.ids for b in batches])
    extra = np.concatenate([b.extra_labels for b in batches])
    assert extra.shape == (70, 1) and not np.array_equal(got_ids, np.sort(got_ids))
    rows = got_ids & ((1 << ID_FILE_SHIFT) - 1)
    np.testing.assert_array_equal(extra[:, 0], rows % 5)


def test_global_shuffle_carries_extra_labels(global_shuffles):
    results = global_shuffles["extra"]  # files 300, 200, 250, 150 (see conftest.py)
    all_ids = np.concatenate([r["ids"] for r in results])
    assert all_ids.size == 900 and np.unique(all_ids).size == 900
    for rank, r in enumerate(results):
        origin = (r["ids"] >> ID_FILE_SHIFT) % 2
        assert (origin != rank).sum() > 50  # samples did cross workers
        rows = r["ids"] & ((1 << ID_FILE_SHIFT) - 1)
        assert r["extra"].shape == (r["ids"].size, 1)
        np.testing.assert_array_equal(r["extra"][:, 0], rows % 5)  # travelled with the id
        np.testing.assert_array_equal(r["labels"], rows % 2)
