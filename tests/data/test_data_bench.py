"""``sparseps bench data`` in miniature: the records have the promised shape (DESIGN §2.1).

A few thousand rows and one repeat: this checks names, units, params and that every
record carries a baseline measured in the same run, not the figures themselves.
"""

import json
import math

import pytest

from sparseps.benchmarking import load_benchmark

pytestmark = pytest.mark.timeout(120)


def test_bench_data_records_have_the_promised_shape():
    records = load_benchmark("data").run(quick=True, rows=4000, repeats=1)
    as_json = [json.loads(json.dumps(r.to_json())) for r in records]
    for record in as_json:
        assert set(record) == {"metric", "value", "unit", "baseline", "ratio", "params"}
        assert record["value"] > 0 and record["baseline"] is not None and record["baseline"] > 0
        assert record["ratio"] is not None
        assert math.isclose(record["ratio"], record["value"] / record["baseline"], rel_tol=1e-9)
    parse = [r for r in as_json if r["metric"] == "parse_rows_per_s"]
    assert sorted((r["params"]["format"], r["params"]["threads"]) for r in parse) == [
        ("criteo_tsv", 1), ("criteo_tsv", 2), ("multislot_string", 1), ("slot_text", 1),
    ]  # fmt: skip
    # the TSV passes read both files; the slot text and multislot ones the first file
    assert [(r["unit"], r["params"]["rows"]) for r in parse] == [("rows/s", 4000)] * 2 + [
        ("rows/s", 2000)
    ] * 2
    assert {r["metric"] for r in as_json} == {
        "parse_rows_per_s", "gen_rows_per_s", "hash_values_per_s",
    }  # fmt: skip
