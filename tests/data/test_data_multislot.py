"""Paddle's multislot text and data generator classes (sparseps.data.MultiSlotDataGenerator).

- the generator classes print exactly what Paddle's print (same checks, same text);
- format="multislot" reads PaddleRec's reader output (examples/paddle_port/reader.py as a
  pipe_command) into the very batches the slot text read gives;
- format="multislot_string" hashes ids like the TSV parser (same ids for the same strings);
- bad multislot lines are reported with their line number and reason.
"""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import pytest

import sparseps.data as fleet
from sparseps.data import CRITEO, CRITEO_SLOT, QueueDataset, Schema
from sparseps.data.multislot import parse_multislot
from sparseps.errors import ConfigError, InputError

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SLOT_TXT = os.path.join(ROOT, "tests", "fixtures", "criteo_slot_sample.txt")
READER = os.path.join(ROOT, "examples", "paddle_port", "reader.py")
PADDLEREC_ORDER = ("click", *(str(i) for i in range(1, 27)), "dense_feature")


def _run(generator, lines, monkeypatch) -> str:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(lines)))
    monkeypatch.setattr(sys, "stdout", out)
    generator.run_from_stdin()
    return out.getvalue()


class Words(fleet.MultiSlotDataGenerator):
    def generate_sample(self, line):
        def local_iter():
            if line.startswith("#"):
                yield None  # skipped, as in Paddle
                return
            words = [int(x) for x in line.split()]
            yield [("words", words), ("label", [len(words) % 2]), ("w", [0.5 * len(words)])]

        return local_iter


def test_multislot_generator_prints_paddles_text(monkeypatch):
    text = _run(Words(), ["1926 8 17\n", "# comment\n", "5\n"], monkeypatch)
    assert text == "3 1926 8 17 1 1 1 1.5\n1 5 1 1 1 0.5\n"


def test_string_generator_prints_paddles_text_and_empty_slots_as_zero(monkeypatch):
    class Strings(fleet.MultiSlotStringDataGenerator):
        def generate_sample(self, line):
            def it():
                a, b = line.rstrip("\n").split(",")
                yield [("a", [a] if a else []), ("b", [b, b])]

            return it

    assert _run(Strings(), ["x,y\n", ",z\n"], monkeypatch) == "1 x 2 y y\n0 2 z z\n"


def test_generate_batch_and_set_batch_see_batches(monkeypatch):
    seen = []

    class Batched(Words):
        def generate_batch(self, samples):
            seen.append(len(samples))
            return super().generate_batch(samples)

    gen = Batched()
    gen.set_batch(2)
    text = _run(gen, ["1\n", "2\n", "3\n", "4\n", "5\n"], monkeypatch)
    assert seen == [2, 2, 1] and text.count("\n") == 5


def test_run_from_memory_calls_generate_sample_with_none(monkeypatch):
    class Memory(fleet.MultiSlotDataGenerator):
        def generate_sample(self, line):
            assert line is None

            def it():
                for i in range(3):
                    yield [("x", [i + 1])]

            return it

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    Memory().run_from_memory()
    assert out.getvalue() == "1 1\n1 2\n1 3\n"


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ([("a", [])], "can not be empty"),
        ([("a", ["x"])], "must be in int or float"),
        ([("a", (1,))], "must be in list type"),
        ({"a": [1]}, "list or tuple"),
    ],
)
def test_multislot_generator_checks_like_paddle(sample, message):
    with pytest.raises(ValueError, match=message):
        fleet.MultiSlotDataGenerator()._gen_str(sample)


def test_every_sample_must_keep_the_first_samples_slots():
    gen = fleet.MultiSlotDataGenerator()
    gen._gen_str([("a", [1]), ("b", [2])])
    with pytest.raises(ValueError, match="inconsistent"):
        gen._gen_str([("a", [1])])
    with pytest.raises(ValueError, match="require<b>, get<c>"):
        gen._gen_str([("a", [1]), ("c", [2])])


def test_paddlerec_reader_as_pipe_command_gives_the_slot_text_batches():
    schema = Schema(
        label="click", dense=("dense_feature",) * 13, slots=tuple(str(i) for i in range(1, 27)),
        dense_transform="raw", multislot_order=PADDLEREC_ORDER,
    )  # fmt: skip
    command = f"{sys.executable} {READER}"
    piped = list(QueueDataset(SLOT_TXT, schema, 1000, pipe_command=command, format="multislot"))
    direct = list(QueueDataset(SLOT_TXT, CRITEO_SLOT, 1000, format="slot_text"))
    (a,), (b,) = piped, direct
    with open(SLOT_TXT) as f:
        lines = sum(1 for line in f if line.strip())
    assert len(a) == len(b) == lines
    np.testing.assert_array_equal(a.label, b.label)
    np.testing.assert_array_equal(a.dense, b.dense)
    for name in schema.slots:
        np.testing.assert_array_equal(a.slots[name].values, b.slots[name].values)
        np.testing.assert_array_equal(a.slots[name].offsets, b.slots[name].offsets)


def test_multislot_string_ids_are_the_tsv_ids(tmp_path):
    row = ["1", "3", "", *["7"] * 11, "68fd1e64", "", *["abc"] * 24]
    (tmp_path / "a.tsv").write_text("\t".join(row) + "\n")
    multi = ["1 1", "1 3", "1 0", *["1 7"] * 11, "1 68fd1e64", "0", *["1 abc"] * 24]
    (tmp_path / "a.txt").write_text(" ".join(multi) + "\n")
    tsv = next(iter(QueueDataset(str(tmp_path / "a.tsv"), CRITEO, 4)))
    ms = next(iter(QueueDataset(str(tmp_path / "a.txt"), CRITEO, 4, format="multislot_string")))
    np.testing.assert_array_equal(tsv.dense, ms.dense)
    for name in CRITEO.slots:
        np.testing.assert_array_equal(tsv.slots[name].values, ms.slots[name].values)
        np.testing.assert_array_equal(tsv.slots[name].offsets, ms.slots[name].offsets)


SMALL = Schema("click", ("d",) * 2, ("1", "2"), dense_transform="raw")
DEFAULT_ORDER = (
    "the default multislot_order: label, extra labels, dense names, slots; if the generator "
    "yields another order, pass it as Schema(multislot_order=(...))"
)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("x 1 2 1 2 1 5 0", "count 'x' of slot 'click' is not a non-negative integer "
                            f"(slot 1 of 4 in {DEFAULT_ORDER})"),
        ("1 y 2 1 2 1 5 0", "label 'y' of 'click' is not a finite number"),
        ("1 1 2 1 nan 1 5 0", "value 'nan' of 'd' is not a finite number"),
        ("1 1 2 1 2 1 -5 0", "id '-5' of slot '1' is not an unsigned 64-bit integer"),
        ("1 1 2 1 2 1 5", f"the line ends inside slot '2' (slot 4 of 4 in {DEFAULT_ORDER})"),
        ("1 1 3 1 2 3 1 5 0", f"'d' has 3 values, the schema has 2 (slot 2 of 4 in {DEFAULT_ORDER})"),
        ("2 1 1 2 1 2 1 5 0", "'click' has 2 values, the schema has 1 "
                              f"(slot 1 of 4 in {DEFAULT_ORDER})"),
        ("1 1 2 1 2 1 5 0 7", f"more tokens after the last slot '2' ('7'...) (slot 4 of 4 in {DEFAULT_ORDER})"),
    ],
)  # fmt: skip
def test_multislot_bad_lines(line, reason):
    data = f"1 0 2 1 2 2 8 9 1 4\n\n{line}\n1 1 2 3 4 0 1 6\n".encode()
    parsed = parse_multislot(data, SMALL, first_line=1, file_no=0, first_record=0)
    assert parsed.bad == 1 and parsed.examples == [(3, reason)] and parsed.lines == 4
    b = parsed.batch
    assert b.label.tolist() == [0, 1] and b.dense.tolist() == [[1, 2], [3, 4]]
    assert b.slots["1"].values.tolist() == [8, 9] and b.slots["1"].offsets.tolist() == [0, 2, 2]
    assert b.slots["2"].values.tolist() == [4, 6] and b.slots["2"].offsets.tolist() == [0, 1, 2]


def test_multislot_order_names_every_schema_column_once_and_skips_others():
    with pytest.raises(ConfigError, match="missing: 2"):
        Schema("click", ("d",), ("1", "2"), multislot_order=("click", "d", "1"))
    with pytest.raises(ConfigError, match="repeated: 1"):
        Schema("click", ("d",), ("1", "2"), multislot_order=("click", "d", "1", "1", "2"))
    schema = Schema("click", ("d",), ("1",), dense_transform="raw",
                    multislot_order=("ins_id", "1", "click", "d"))  # fmt: skip
    parsed = parse_multislot(b"1 abc 2 5 6 1 1 1 0.5\n", schema, first_line=1, file_no=0,
                             first_record=0)  # fmt: skip
    assert parsed.bad == 0 and parsed.batch.slots["1"].values.tolist() == [5, 6]
    assert parsed.batch.label.tolist() == [1] and parsed.batch.dense.tolist() == [[0.5]]


def test_counts_that_do_not_fit_name_multislot_order(tmp_path):
    # the generator yields the dense slot first; the schema, without multislot_order,
    # reads the label first: every line is bad, and the error says how to fix it
    schema = Schema("label", ("dense",) * 3, ("1", "2"), dense_transform="raw")
    path = tmp_path / "part-0.txt"
    path.write_text("3 0.1 0.2 0.3 1 1 1 5 1 6\n" * 4)
    with pytest.raises(InputError) as err:
        list(QueueDataset(str(path), schema, 8, format="multislot"))
    assert (
        f"{path}:1: 'label' has 3 values, the schema has 1 (slot 1 of 4 in {DEFAULT_ORDER})"
        in str(err.value)
    )
    ordered = Schema("label", ("dense",) * 3, ("1", "2"), dense_transform="raw",
                     multislot_order=("dense", "label", "1", "2"))  # fmt: skip
    (batch,) = QueueDataset(str(path), ordered, 8, format="multislot")
    assert batch.label.tolist() == [1] * 4 and batch.slots["2"].values.tolist() == [6] * 4
    with pytest.raises(InputError, match=r"'label' has 3 values, the schema has 1 \(slot 1 of 4 "
                                         r"in multislot_order\)"):  # fmt: skip
        list(QueueDataset(str(path), Schema("label", ("dense",) * 3, ("1", "2"),
             multislot_order=("label", "dense", "1", "2")), 8, format="multislot"))  # fmt: skip
