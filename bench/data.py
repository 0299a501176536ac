"""Data pipeline throughput: parse rows/s against a bare pyarrow read, gen-data rows/s.

Records (``sparseps bench data [--quick] [--json]``):

- ``parse_rows_per_s``: a full QueueDataset pass (parse, hash, batch) over Criteo TSV
  written by gen-data, with ``threads`` reader threads; baseline: ``pyarrow.csv.read_csv``
  of the same files with the same number of threads (type inference, no hashing, no
  batches). Timings are the best of a few runs (the machine is shared).
- ``parse_rows_per_s`` with ``format=slot_text``: the same rows in the slot text format;
  baseline as above (the Criteo TSV read of the same rows).
- ``parse_rows_per_s`` with ``format=multislot_string``: the same rows as Paddle's
  ``MultiSlotStringDataGenerator`` prints them (count + value per slot, ids hashed);
  baseline as above.
- ``hash_values_per_s``: the compiled XXH64 over an arrow string column; baseline: one
  ``xxhash.xxh64_intdigest`` call per value (why the port exists).
- ``gen_rows_per_s``: ``write_dataset`` (generate + write TSV); baseline: writing the same
  rows with ``pyarrow.csv.write_csv`` alone.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import xxhash

from sparseps.benchmarking import BenchRecord
from sparseps.data import CRITEO, CRITEO_SLOT, QueueDataset
from sparseps.data.hashing import hash_string_array, slot_seed
from sparseps.data.synthetic import generate, to_table, write_dataset


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _pair(mine, base, repeats: int) -> tuple[float, float]:
    """Best times of ``mine`` and ``base``, interleaved so both see the same machine load."""
    times = [(_best(mine, 1), _best(base, 1)) for _ in range(repeats)]
    return min(t[0] for t in times), min(t[1] for t in times)


def _pass(files, threads: int, schema=CRITEO, **kwargs) -> int:
    return sum(len(b) for b in QueueDataset(files, schema, 4096, threads=threads, **kwargs))


def _arrow_read(files, threads: int) -> int:
    options = pacsv.ReadOptions(use_threads=threads > 1, autogenerate_column_names=True)
    parse = pacsv.ParseOptions(delimiter="\t")
    return sum(pacsv.read_csv(f, read_options=options, parse_options=parse).num_rows for f in files)


def _to_slot_text(tsv: Path, out: Path) -> None:
    """The same rows in PaddleRec's slot text format (ids = the hex values as integers)."""
    table = pacsv.read_csv(
        tsv,
        read_options=pacsv.ReadOptions(column_names=list(CRITEO.columns())),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(CRITEO.slots, pa.string())),
    )
    n = table.num_rows
    parts = [np.char.add("click:", table["label"].to_numpy().astype(str))]
    for name in CRITEO.dense:
        dense = np.log1p(np.maximum(table[name].fill_null(0).to_numpy(), 0))
        parts.append(np.char.add(" dense_feature:", np.round(dense, 4).astype(str)))
    for s, name in enumerate(CRITEO.slots):
        text = table[name].fill_null("--------").to_numpy(zero_copy_only=False).astype("S8")
        digits = np.frombuffer(text.tobytes(), np.uint8).reshape(n, 8).astype(np.int64)
        digits = np.where(digits >= 97, digits - 87, digits - 48)  # hex digit values
        ids = np.where(digits[:, 0] >= 0, digits @ (16 ** np.arange(7, -1, -1)), -1)
        token = np.char.add(f" {s + 1}:", ids.astype(str))
        parts.append(np.where(ids >= 0, token, ""))
    lines = parts[0]
    for p in parts[1:]:
        lines = np.char.add(lines, p)
    out.write_text("\n".join(lines.tolist()) + "\n")
    assert len(lines) == n


def _to_multislot(tsv: Path, out: Path) -> int:
    """The same rows as MultiSlotStringDataGenerator prints them (label, I1..I13, C1..C26)."""
    table = pacsv.read_csv(
        tsv,
        read_options=pacsv.ReadOptions(column_names=list(CRITEO.columns())),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(CRITEO.columns(), pa.string()), strings_can_be_null=True
        ),
    )
    lines = np.char.add("1 ", table["label"].to_numpy(zero_copy_only=False).astype(str))
    for name in CRITEO.dense:
        values = table[name].fill_null("0").to_numpy(zero_copy_only=False).astype(str)
        lines = np.char.add(np.char.add(lines, " 1 "), values)
    for name in CRITEO.slots:
        column = table[name]
        values = column.fill_null("").to_numpy(zero_copy_only=False).astype(str)
        token = np.where(
            column.is_valid().to_numpy(zero_copy_only=False), np.char.add(" 1 ", values), " 0"
        )
        lines = np.char.add(lines, token)
    out.write_text("\n".join(lines.tolist()) + "\n")
    return len(lines)


def run(quick: bool, *, rows: int | None = None, repeats: int | None = None) -> list[BenchRecord]:
    """The records above; ``rows``/``repeats`` override the sizes (a smoke test uses a
    few thousand rows and one repeat: the record shapes, not the figures)."""
    rows = rows or (200_000 if quick else 1_000_000)
    repeats = repeats or (3 if quick else 5)
    cores = os.cpu_count()
    records: list[BenchRecord] = []
    with tempfile.TemporaryDirectory(prefix="sparseps-bench-data-") as tmp:
        out = Path(tmp)
        gen_s = _best(lambda: write_dataset(out / "gen", rows, seed=1, files=2, test_rows=0), 1)
        table = to_table(generate(rows, 1))
        options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
        write_s = _best(lambda: pacsv.write_csv(table, str(out / "plain.tsv"), options), repeats)
        records.append(
            BenchRecord("gen_rows_per_s", rows / gen_s, "rows/s", rows / write_s,
                        {"rows": rows, "files": 2, "cores": cores, "baseline": "pyarrow write_csv only"})
        )  # fmt: skip
        files = sorted(str(p) for p in (out / "gen" / "train").glob("*.tsv"))
        _pass(files[:1], 1)  # warm the compiled kernels and the page cache
        for threads in (1, 2):
            mine, base = _pair(
                lambda t=threads: _pass(files, t), lambda t=threads: _arrow_read(files, t), repeats
            )
            records.append(
                BenchRecord("parse_rows_per_s", rows / mine, "rows/s", rows / base,
                            {"format": "criteo_tsv", "threads": threads, "rows": rows,
                             "per_thread": round(rows / mine / threads), "cores": cores,
                             "baseline": f"pyarrow.csv.read_csv use_threads={threads > 1}"})
            )  # fmt: skip
        slot_file = out / "slot.txt"
        _to_slot_text(Path(files[0]), slot_file)
        slot_rows = _pass([str(slot_file)], 1, schema=CRITEO_SLOT, format="slot_text")
        mine, base = _pair(
            lambda: _pass([str(slot_file)], 1, schema=CRITEO_SLOT, format="slot_text"),
            lambda: _arrow_read(files[:1], 1),
            repeats,
        )
        records.append(
            BenchRecord("parse_rows_per_s", slot_rows / mine, "rows/s", slot_rows / base,
                        {"format": "slot_text", "threads": 1, "rows": slot_rows, "cores": cores,
                         "baseline": "pyarrow.csv.read_csv of the same rows as Criteo TSV"})
        )  # fmt: skip
        multi_file = out / "multislot.txt"
        _to_multislot(Path(files[0]), multi_file)
        multi_rows = _pass([str(multi_file)], 1, format="multislot_string")
        mine, base = _pair(
            lambda: _pass([str(multi_file)], 1, format="multislot_string"),
            lambda: _arrow_read(files[:1], 1),
            repeats,
        )
        records.append(
            BenchRecord("parse_rows_per_s", multi_rows / mine, "rows/s", multi_rows / base,
                        {"format": "multislot_string", "threads": 1, "rows": multi_rows,
                         "cores": cores,
                         "baseline": "pyarrow.csv.read_csv of the same rows as Criteo TSV"})
        )  # fmt: skip
    strings = table.column("C3").combine_chunks().cast(pa.string())
    hash_string_array(strings[:10], "C3")
    mine = _best(lambda: hash_string_array(strings, "C3"), repeats)
    sample = strings[:50_000].to_pylist()
    seed = slot_seed("C3")
    base = _best(lambda: [xxhash.xxh64_intdigest(v.encode(), seed) for v in sample if v], repeats)
    records.append(
        BenchRecord("hash_values_per_s", len(strings) / mine, "values/s", len(sample) / base,
                    {"values": len(strings), "baseline": "xxhash.xxh64_intdigest per value"})
    )  # fmt: skip
    return records
