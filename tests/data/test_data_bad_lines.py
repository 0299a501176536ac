"""Malformed input: counted and skipped (first few logged as file:line: reason), or strict.

These tests skip more bad lines than the default ``max_bad_ratio`` allows, so they pass
``max_bad_ratio=1.0`` (SKIP); test_data_bad_pass.py covers the passes that fail."""

import logging

import numpy as np
import pytest

from sparseps.data import CRITEO, InMemoryDataset, QueueDataset, Schema
from sparseps.data import sources as sources_module
from sparseps.errors import DeadlineError, InputError

SKIP = {"max_bad_ratio": 1.0}
GOOD = "\t".join(["1", *["2"] * 13, *["abc"] * 26])


def tsv(*fields_lines: str) -> str:
    return "\n".join(fields_lines) + "\n"


def with_fields(**changes) -> str:
    fields = GOOD.split("\t")
    names = CRITEO.columns()
    for name, value in changes.items():
        fields[names.index(name)] = value
    return "\t".join(fields)


MIXED = tsv(
    GOOD,  # line 1
    "1\t2\t3",  # line 2: short
    with_fields(I3="abc"),  # line 3: non-numeric dense
    with_fields(label="x"),  # line 4: bad label
    "",  # line 5: blank, skipped silently
    with_fields(label=""),  # line 6: no label
    with_fields(I1="nan"),  # line 7: not finite
    GOOD,  # line 8
)


def test_bad_lines_are_counted_skipped_and_the_first_logged(tmp_path, caplog):
    path = tmp_path / "mixed.tsv"
    path.write_text(MIXED)
    ds = QueueDataset(str(path), CRITEO, batch_size=10, **SKIP)
    with caplog.at_level(logging.WARNING, logger="sparseps.data"):
        batches = list(ds)
    assert sum(len(b) for b in batches) == 2
    stats = ds.stats()
    assert (stats.rows, stats.bad_lines, stats.files) == (2, 5, 1)
    examples = stats.passes[0].bad_examples
    assert [e.split(": ", 1)[0] for e in examples] == [f"{path}:{n}" for n in (2, 3, 4, 6, 7)]
    assert "expected 40 fields, got 3" in examples[0]
    assert "I3 is not a finite number ('abc')" in examples[1]
    assert "label is not a finite number ('x')" in examples[2]
    assert "no label" in examples[3]
    assert "I1 is not a finite number ('nan')" in examples[4]
    logged = [r.getMessage() for r in caplog.records if "skipped bad line" in r.getMessage()]
    assert len(logged) == 5 and f"{path}:2:" in logged[0]
    # a second pass counts again, separately
    list(ds)
    assert [p.bad_lines for p in ds.stats().passes] == [5, 5] and ds.stats().bad_lines == 10


def test_only_the_first_five_are_described(tmp_path):
    path = tmp_path / "many.tsv"
    path.write_text(tsv(*["short"] * 12, GOOD))
    ds = QueueDataset(str(path), CRITEO, batch_size=10, **SKIP)
    assert sum(len(b) for b in ds) == 1
    assert ds.stats().bad_lines == 12 and len(ds.stats().passes[0].bad_examples) == 5


def test_strict_raises_on_the_first_bad_line_naming_file_and_line(tmp_path):
    path = tmp_path / "mixed.tsv"
    path.write_text(MIXED)
    with pytest.raises(InputError, match=rf"{path}:2: expected 40 fields, got 3"):
        list(QueueDataset(str(path), CRITEO, batch_size=10, strict=True))
    ds = InMemoryDataset(str(path), CRITEO, batch_size=10, strict=True)
    ds.preload_into_memory()
    with pytest.raises(InputError, match=rf"{path}:2:"):
        ds.wait_preload_done(timeout=30)


def test_line_numbers_stay_right_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(sources_module, "CHUNK_BYTES", 500)  # a few lines per chunk
    lines = [GOOD] * 40
    for n in (5, 17, 18, 33):
        lines[n - 1] = with_fields(I2="oops")
    path = tmp_path / "chunks.tsv"
    path.write_text(tsv(*lines))
    ds = QueueDataset(str(path), CRITEO, batch_size=7, **SKIP)
    assert sum(len(b) for b in ds) == 36
    got = [e.split(": ", 1)[0] for e in ds.stats().passes[0].bad_examples]
    assert got == [f"{path}:{n}" for n in (5, 17, 18, 33)]


SLOT_SCHEMA = Schema("click", ("d", "d"), ("1", "2"), dense_transform="raw")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("click:1 d:1 d:2 1:5 oops", "token 'oops' has no ':'"),
        ("click:1 d:1 d:2 1:abc", "id '1:abc' is not an unsigned 64-bit integer"),
        ("click:1 d:1 d:2 1:-3", "id '1:-3' is not an unsigned 64-bit integer"),
        ("click:1 d:1 d:2 2:18446744073709551616", "is not an unsigned 64-bit integer"),
        ("click:x d:1 d:2", "label 'click:x' is not a finite number"),
        ("click:1 d:1 d:1e999", "dense value 'd:1e999' is not a finite number"),
        ("d:1 d:2 1:5", "no label ('click') on the line"),
        ("click:1 d:1 1:5", "wrong number of 'd' values (the schema has 2)"),
        ("click:1 d:1 d:2 d:3", "wrong number of 'd' values (the schema has 2)"),
        ("click:1 click:0 d:1 d:2", "label 'click:0' appears twice"),
    ],
)
def test_slot_text_bad_lines(tmp_path, line, reason):
    path = tmp_path / "s.txt"
    path.write_text(f"click:0 d:1 d:2 1:1\n{line}\nclick:1 d:3 d:4 2:9\n")
    ds = QueueDataset(str(path), SLOT_SCHEMA, batch_size=10, format="slot_text", **SKIP)
    batch = next(iter(ds))
    np.testing.assert_array_equal(batch.label, [0, 1])
    assert batch.slots["1"].values.tolist() == [1] and batch.slots["2"].values.tolist() == [9]
    (example,) = ds.stats().passes[0].bad_examples
    assert example.startswith(f"{path}:2: ") and reason in example
    with pytest.raises(InputError, match=f"{path}:2: "):
        list(QueueDataset(str(path), SLOT_SCHEMA, batch_size=10, format="slot_text", strict=True))


@pytest.mark.parametrize("fmt", ["criteo_tsv", "csv", "slot_text", "parquet"])
def test_empty_file_gives_zero_rows_in_every_format(tmp_path, fmt):
    path = tmp_path / f"empty.{fmt}"
    path.write_bytes(b"")
    ds = QueueDataset(str(path), CRITEO, batch_size=4, format=fmt)
    assert list(ds) == [] and ds.stats().rows == 0 and ds.stats().bad_lines == 0
    assert ds.stats().passes[0].files == 1  # the file was read, not skipped as missing
    memory = InMemoryDataset(str(path), CRITEO, batch_size=4, format=fmt)
    memory.load_into_memory()
    assert len(memory) == 0 and list(memory) == []


def test_empty_file_through_a_pipe_command_gives_zero_rows(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    ds = QueueDataset(str(tmp_path / "empty.txt"), CRITEO, batch_size=4, pipe_command="cat")
    assert list(ds) == [] and ds.stats().rows == 0


def test_a_non_empty_file_that_is_not_parquet_is_named(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR")  # truncated: not empty, not Parquet
    with pytest.raises(InputError, match=r"broken\.parquet: not a readable Parquet file"):
        list(QueueDataset(str(path), CRITEO, batch_size=4, format="parquet"))


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.tsv"
    with pytest.raises(InputError, match="nope.tsv.*does not exist"):
        QueueDataset([str(missing)], CRITEO, batch_size=4)
    path = tmp_path / "gone.tsv"
    path.write_text(GOOD + "\n")
    ds = QueueDataset(str(path), CRITEO, batch_size=4)
    path.unlink()  # removed after the dataset was made: the pass fails naming it
    with pytest.raises(InputError, match="gone.tsv"):
        list(ds)


def test_csv_header_without_the_schema_columns(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("label,I1\n1,2\n")
    with pytest.raises(InputError, match=r"h.csv:1: header lacks the schema's columns I2"):
        list(QueueDataset(str(path), CRITEO, batch_size=4, format="csv"))


def test_failing_pipe_command_names_command_file_code_and_stderr(tmp_path):
    path = tmp_path / "raw.txt"
    path.write_text("whatever\n")
    command = "cat > /dev/null; echo 'converter: bad input' >&2; exit 3"
    with pytest.raises(InputError) as info:
        list(QueueDataset(str(path), SLOT_SCHEMA, batch_size=4, pipe_command=command))
    text = str(info.value)
    assert command in text and str(path) in text and "exit code 3" in text
    assert "converter: bad input" in text


def test_silent_pipe_command_times_out(tmp_path):
    path = tmp_path / "raw.txt"
    path.write_text("x\n")
    ds = QueueDataset(str(path), SLOT_SCHEMA, 4, pipe_command="sleep 5", pipe_timeout=0.5)
    with pytest.raises(DeadlineError, match="printed nothing") as info:
        list(ds)
    assert info.value.setting == "pipe_timeout"
