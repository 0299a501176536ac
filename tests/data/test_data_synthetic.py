"""gen-data: deterministic per seed, realistic CTR, planted AUC printed and stored."""

import json
from itertools import product

import numpy as np
import pytest

from sparseps.cli import main
from sparseps.data import CRITEO, Batch, QueueDataset
from sparseps.data.auc import exact_auc
from sparseps.data.synthetic import CARDINALITIES, _rows, generate, planted_model


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


def test_written_rows_match_the_generator_and_its_planted_auc(tmp_path):
    gen(tmp_path, "--seed", "9", "--test-rows", "2000")
    meta = json.loads((tmp_path / "meta.json").read_text())
    data = generate(2000, 9, split="test")
    assert meta["bayes_auc_test"] == pytest.approx(exact_auc(data.label, data.prob), abs=1e-12)
    lines = (tmp_path / "test" / "part-00000.tsv").read_text().splitlines()
    first = lines[0].split("\t")
    assert len(lines) == 2000 and len(first) == 40
    assert int(first[0]) == data.label[0]
    cats = [f for f in first[14:] if f]
    assert all(len(v) == 8 and int(v, 16) >= 0 for v in cats)  # 8 hex digits, like Criteo
    dense = [f for f in first[1:14] if f]
    assert all(int(v) >= -1 for v in dense)


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
