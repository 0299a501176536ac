"""gen-data: deterministic per seed, realistic CTR, planted AUC printed and stored."""

import json
from dataclasses import replace
from itertools import product

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from sparseps.cli import main
from sparseps.data import CRITEO, Batch, QueueDataset
from sparseps.data.auc import exact_auc
from sparseps.data.synthetic import (
    CARDINALITIES,
    CROSSES,
    NUM_DENSE,
    _codes,
    _key,
    _logits,
    _Rows,
    _rows,
    generate,
    planted_model,
)


def gen(out, *extra: str) -> int:
    return main(["gen-data", "--rows", "30000", "--out", str(out), "--files", "3", *extra])


def read_tree(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.tsv"))}


def test_gen_data_is_deterministic_per_seed(tmp_path, capsys):
    assert gen(tmp_path / "a", "--seed", "5") == 0
    printed = capsys.readouterr().out
    assert gen(tmp_path / "b", "--seed", "5") == 0
    assert gen(tmp_path / "c", "--seed", "6") == 0
    a, b, c = (read_tree(tmp_path / x) for x in "abc")
    assert list(a) == [
        "test/part-00000.tsv", "train/part-00000.tsv", "train/part-00001.tsv", "train/part-00002.tsv",
    ]  # fmt: skip
    assert a == b
    assert all(a[k] != c[k] for k in a)
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["rows"] == 30000 and meta["test_rows"] == 3000 and meta["seed"] == 5
    assert 0.20 <= meta["ctr_train"] <= 0.25 and 0.20 <= meta["ctr_test"] <= 0.25
    assert 0.78 <= meta["bayes_auc_train"] <= 0.88 and 0.78 <= meta["bayes_auc_test"] <= 0.88
    assert f"{meta['bayes_auc_train']:.4f} on train" in printed
    assert f"{meta['bayes_auc_test']:.4f} on test" in printed
    # the files are valid Criteo TSV with the promised rows and CTR
    ds = QueueDataset(str(tmp_path / "a" / "train"), CRITEO, batch_size=4096, strict=True)
    batch = Batch.concat(list(ds))
    assert len(batch) == 30000 and ds.stats().bad_lines == 0
    assert batch.label.mean() == pytest.approx(meta["ctr_train"])


def _uncode(model, codes: np.ndarray) -> np.ndarray:
    """The inverse of ``synthetic._codes``: the value index of each written 8-hex code."""
    x = codes.astype(np.uint32)
    x ^= (x >> np.uint32(13)) ^ (x >> np.uint32(26))  # undo x ^= x >> 13 (32-bit)
    x = x * np.uint32(pow(0x85EBCA77, -1, 2**32))
    x ^= (x >> np.uint32(15)) ^ (x >> np.uint32(30))  # undo x ^= x >> 15
    x = x * np.uint32(pow(0x9E3779B1, -1, 2**32))
    salt = np.array([_key(model.seed, s, 3) & 0xFFFFFFFF for s in range(x.shape[1])], np.uint32)
    return (x ^ salt).astype(np.int64)


def _read_written(paths) -> tuple[np.ndarray, _Rows]:
    """Labels and model inputs read back from written TSV files (nothing else used)."""
    names = list(CRITEO.columns())
    types = {"label": pa.int8(), **dict.fromkeys(CRITEO.dense, pa.int64()),
             **dict.fromkeys(CRITEO.slots, pa.string())}  # fmt: skip
    table = pa.concat_tables(
        pacsv.read_csv(
            str(path),
            read_options=pacsv.ReadOptions(column_names=names),
            parse_options=pacsv.ParseOptions(delimiter="\t"),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
        )
        for path in paths
    )
    n = table.num_rows
    dense = np.stack([table[c].fill_null(0).to_numpy() for c in CRITEO.dense], axis=1)
    dense_present = np.stack([table[c].is_valid().to_numpy() for c in CRITEO.dense], axis=1)
    present = np.stack([table[c].is_valid().to_numpy() for c in CRITEO.slots], axis=1)
    codes = np.zeros((n, len(CRITEO.slots)), np.uint32)
    for j, c in enumerate(CRITEO.slots):
        text = table[c].fill_null("00000000").to_numpy(zero_copy_only=False).astype("S8")
        digits = np.frombuffer(text.tobytes(), np.uint8).reshape(n, 8).astype(np.int64)
        digits = np.where(digits >= ord("a"), digits - ord("a") + 10, digits - ord("0"))
        codes[:, j] = (digits @ (16 ** np.arange(7, -1, -1))).astype(np.uint32)
    return table["label"].to_numpy(), _Rows(codes, present, dense, dense_present, None)


def test_written_rows_match_the_generator_and_its_planted_auc(tmp_path, capsys):
    gen(tmp_path, "--seed", "9", "--test-rows", "2000")
    printed = capsys.readouterr().out
    meta = json.loads((tmp_path / "meta.json").read_text())
    model = planted_model(9)
    values = np.random.default_rng(0).integers(0, CARDINALITIES, (1000, len(CARDINALITIES)))
    np.testing.assert_array_equal(_uncode(model, _codes(model, values)), values)
    for split, sizes in (("train", [10000] * 3), ("test", [2000])):
        labels, rows = _read_written(meta[f"{split}_files"])
        # every label of every written file is the generator's, in order
        expected = [generate(n, 9, split=split, part=p, model=model) for p, n in enumerate(sizes)]
        np.testing.assert_array_equal(labels, np.concatenate([e.label for e in expected]))
        # the planted probability, recomputed from nothing but the written rows ...
        inputs = replace(rows, values=_uncode(model, rows.values))
        prob = 1 / (1 + np.exp(-(model.bias + _logits(model, inputs, day=0))))
        np.testing.assert_allclose(prob, np.concatenate([e.prob for e in expected]), rtol=1e-12)
        # ... gives exactly the AUC gen-data printed and stored
        auc = exact_auc(labels, prob)
        assert auc == pytest.approx(meta[f"bayes_auc_{split}"], abs=1e-12)
        assert f"{auc:.4f} on {split}" in printed
    lines = (tmp_path / "test" / "part-00000.tsv").read_text().splitlines()
    first = lines[0].split("\t")
    assert len(lines) == 2000 and len(first) == 40
    cats = [f for f in first[14:] if f]
    assert all(len(v) == 8 and int(v, 16) >= 0 for v in cats)  # 8 hex digits, like Criteo
    dense = [f for f in first[1:14] if f]
    assert all(int(v) >= -1 for v in dense)


def test_interaction_terms_change_the_logit():
    model = planted_model(3)
    no_cross = replace(model, cross_scale=np.zeros_like(model.cross_scale))
    rows = _rows(model, 20000, "train", 0, 0)
    delta = _logits(model, rows, day=0) - _logits(no_cross, rows, day=0)
    # the cross terms move the logit exactly where both slots of some pair are present
    both = np.zeros(len(delta), bool)
    for a, b in CROSSES:
        both |= rows.present[:, a] & rows.present[:, b]
    assert np.all(delta[~both] == 0) and np.count_nonzero(delta[both]) > 0.99 * both.sum()
    assert delta[both].std() > 0.05
    # and they are true interactions: not a sum of per-value effects. For one pair, the
    # difference of differences over a 2x2 grid of values cancels every additive term.
    (a, b), grid = CROSSES[0], [(0, 0), (0, 1), (1, 0), (1, 1)]
    values = np.zeros((4, len(CARDINALITIES)), np.int64)
    values[:, a], values[:, b] = [i for i, _ in grid], [j for _, j in grid]
    present = np.zeros_like(values, bool)
    present[:, [a, b]] = True
    dense = np.zeros((4, NUM_DENSE), np.int64)
    square = _Rows(values, present, dense, np.zeros_like(dense, bool), None)

    def dod(m) -> float:
        z = _logits(m, square, day=0)
        return float(z[0] - z[1] - z[2] + z[3])

    assert abs(dod(no_cross)) < 1e-12 and abs(dod(model)) > 1e-3


def test_planted_model_shapes_the_data():
    model = planted_model(3)
    rows = _rows(model, 20000, "train", 0, 0)
    values = rows.values
    # power law: the most frequent value of a big slot is far more frequent than the median one
    big = int(np.argmax(CARDINALITIES))
    counts = np.bincount(values[:, big])
    assert counts.max() > 50 * np.median(counts[counts > 0])
    assert (values < np.array(CARDINALITIES)).all() and (values >= 0).all()
    # some slots are often missing, some almost never
    missing = 1 - rows.present.mean(axis=0)
    assert missing.max() > 0.1 and missing.min() < 0.03
    data = generate(20000, 3, model=model)
    # dense features carry signal: the label correlates with some of them
    feature = np.where(data.dense_present, np.log1p(np.maximum(data.dense, 0)), 0)
    corr = [abs(np.corrcoef(feature[:, j], data.label)[0, 1]) for j in range(13)]
    assert max(corr) > 0.05


def test_drift_changes_the_model_smoothly():
    day0 = generate(5000, 4, drift=0.3, day=0)
    again = generate(5000, 4, drift=0.0, day=0)
    np.testing.assert_array_equal(day0.prob, again.prob)  # day 0 is the base model
    day1 = generate(5000, 4, drift=0.3, day=1)
    day5 = generate(5000, 4, drift=0.3, day=5)
    np.testing.assert_array_equal(day1.codes, day0.codes)  # same rows, new weights
    d1 = np.corrcoef(day0.prob, day1.prob)[0, 1]
    d5 = np.corrcoef(day0.prob, day5.prob)[0, 1]
    assert 1 > d1 > d5


def test_exact_auc_against_all_pairs():
    rng = np.random.default_rng(0)
    for n, levels in product((2, 7, 50), (2, 5, 1000)):
        labels = rng.integers(0, 2, n)
        scores = rng.integers(0, levels, n).astype(float)
        pos, neg = scores[labels == 1], scores[labels == 0]
        if not len(pos) or not len(neg):
            assert np.isnan(exact_auc(labels, scores))
            continue
        pairs = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
        assert exact_auc(labels, scores) == pytest.approx(pairs.mean(), abs=1e-12)
