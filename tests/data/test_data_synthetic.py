"""gen-data: deterministic per seed, realistic CTR, planted AUC printed and stored."""

import json
import math
import warnings
from dataclasses import replace
from itertools import product

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from sparseps.cli import main
from sparseps.data import CRITEO, Batch, QueueDataset
from sparseps.data.synthetic import (
    CARDINALITIES,
    CROSSES,
    NUM_DENSE,
    DataKnobs,
    _codes,
    _key,
    _logits,
    _Rows,
    _rows,
    generate,
    planted_model,
    probability,
    rare_signal_share,
    write_dataset,
)
from sparseps.metrics.functions import exact_auc


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
        auc = exact_auc(prob, labels)
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
        scores = rng.integers(0, levels, n) / levels  # probabilities, with ties
        pos, neg = scores[labels == 1], scores[labels == 0]
        if not len(pos) or not len(neg):
            assert exact_auc(scores, labels) == 0.5  # the one rule: undefined -> 0.5
            continue
        pairs = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
        assert exact_auc(scores, labels) == pytest.approx(pairs.mean(), abs=1e-12)


# --- the data knobs (issue 29) -----------------------------------------------------------

DEFAULT_MD5 = {  # `gen-data --rows 30000 --files 3 --seed 5`, as written before the knobs
    "test/part-00000.tsv": "bb2dbdb26160e952fbdbe3f2e4684d75",
    "train/part-00000.tsv": "151c68ab0ba829e4476061c43e37c61c",
    "train/part-00001.tsv": "35b4c34b7da2d703dc0e0fb6dd8c1637",
    "train/part-00002.tsv": "3a7a7c8f419315d3711de71cd3264388",
}


def test_default_knobs_write_the_same_bytes_as_before(tmp_path):
    import hashlib

    args = ("--seed", "5", "--click-rate", "0.22", "--signal", "1.6", "--zipf", "1.275")
    assert gen(tmp_path, *args, "--rare-power", "0.75", "--label-noise", "0", "--missing", "1") == 0
    tree = read_tree(tmp_path)
    assert {k: hashlib.md5(v).hexdigest() for k, v in tree.items()} == DEFAULT_MD5
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["knobs"] == DataKnobs().as_dict()


def _knob_set(tmp_path, name: str, *args: str) -> tuple[dict, object]:
    out = tmp_path / name
    argv = ["gen-data", "--rows", "40000", "--test-rows", "10000", "--out", str(out), "--seed", "3"]
    assert main([*argv, *args]) == 0
    meta = json.loads((out / "meta.json").read_text())
    model = planted_model(3, knobs=DataKnobs(**meta["knobs"]))
    return meta, model


@pytest.fixture(scope="module")
def knob_set(tmp_path_factory):
    """``_knob_set`` once per distinct list of gen-data arguments in this module: the
    knob tests only read what it wrote (two of them compare against ``--click-rate 0.02``)."""
    made: dict[tuple[str, ...], tuple[dict, object]] = {}

    def make(*args: str) -> tuple[dict, object]:
        if args not in made:
            made[args] = _knob_set(tmp_path_factory.mktemp("knobs"), "set", *args)
        return made[args]

    return make


def _check_recomputed(meta: dict, model) -> None:
    """The planted probability recomputed from the written rows alone gives the stored
    Bayes AUC, and the realised click rate is the asked one within sampling error."""
    target = meta["knobs"]["click_rate"]
    for split, n in (("train", meta["rows"]), ("test", meta["test_rows"])):
        labels, rows = _read_written(meta[f"{split}_files"])
        inputs = replace(rows, values=_uncode(model, rows.values))
        prob = probability(model, model.bias + _logits(model, inputs, day=0))
        assert exact_auc(prob, labels) == pytest.approx(meta[f"bayes_auc_{split}"], abs=1e-12)
        assert labels.mean() == pytest.approx(meta[f"ctr_{split}"])
        # sampling error of the labels (5 sd) plus 5% for the bias solved on 50k rows
        tolerance = 5 * np.sqrt(target * (1 - target) / n) + 0.05 * target
        assert abs(meta[f"ctr_{split}"] - target) < tolerance, (split, meta[f"ctr_{split}"])
        assert abs(prob.mean() - target) < 0.05 * target + 3 * prob.std() / np.sqrt(n)


@pytest.mark.parametrize("rate", [0.005, 0.01, 0.04, 0.1, 0.25])
def test_click_rate_knob(knob_set, rate):
    meta, model = knob_set("--click-rate", str(rate))
    _check_recomputed(meta, model)
    assert 0.75 < meta["bayes_auc_test"] < 0.95


def test_signal_knob_moves_the_bayes_auc(knob_set):
    weak, model = knob_set("--signal", "0.8", "--click-rate", "0.05")
    _check_recomputed(weak, model)
    strong, model = knob_set("--signal", "2.4", "--click-rate", "0.05")
    _check_recomputed(strong, model)
    assert weak["bayes_auc_test"] + 0.1 < strong["bayes_auc_test"]


def test_zipf_knob_concentrates_the_ids(knob_set):
    flat, model = knob_set("--zipf", "1.0")  # the log-law limit
    _check_recomputed(flat, model)
    steep, model_steep = knob_set("--zipf", "2.0")
    _check_recomputed(steep, model_steep)
    _, rows_flat = _read_written(flat["train_files"])
    _, rows_steep = _read_written(steep["train_files"])
    big = int(np.argmax(CARDINALITIES))
    distinct = [len(np.unique(r.values[r.present[:, big], big])) for r in (rows_flat, rows_steep)]
    assert distinct[0] > 5 * distinct[1]


def test_rare_power_knob_moves_signal_into_rare_ids(knob_set):
    damped, _ = knob_set("--click-rate", "0.02")
    rare, model = knob_set("--rare-power", "0", "--click-rate", "0.02")
    _check_recomputed(rare, model)
    assert rare["rare_signal_share"] > 20 * damped["rare_signal_share"]
    assert rare["rare_signal_share"] == pytest.approx(rare_signal_share(model))


def test_label_noise_knob_keeps_the_click_rate_and_lowers_the_bayes_auc(knob_set):
    clean, _ = knob_set("--click-rate", "0.02")
    noisy, model = knob_set("--click-rate", "0.02", "--label-noise", "0.3")
    _check_recomputed(noisy, model)
    assert noisy["bayes_auc_test"] < clean["bayes_auc_test"] - 0.03


def test_missing_knob_scales_the_missing_rates(knob_set):
    none, model = knob_set("--missing", "0")
    _check_recomputed(none, model)
    more, _ = knob_set("--missing", "2")
    default, _ = knob_set()
    rates = []
    for meta in (none, default, more):
        _, rows = _read_written(meta["train_files"])
        rates.append((1 - rows.present.mean(), 1 - rows.dense_present.mean()))
    assert rates[0] == (0.0, 0.0)
    assert rates[2][0] > 1.8 * rates[1][0] and rates[2][1] > 1.8 * rates[1][1]


def test_knobs_out_of_range_are_refused():
    from sparseps.errors import ConfigError

    for bad in ({"click_rate": 0.0}, {"signal": 9.0}, {"zipf": 0.1}, {"label_noise": 1.0},
                {"missing": -1.0}, {"rare_power": float("nan")}, {"click_rate": "0.1"}):  # fmt: skip
        with pytest.raises(ConfigError, match=next(iter(bad))):
            DataKnobs(**bad)


def test_a_dataset_without_test_rows_has_no_test_figures(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "mean of empty slice" before
        meta = write_dataset(tmp_path, 500, seed=1, test_rows=0)
    assert all(math.isnan(meta[k]) for k in ("ctr_test", "bayes_auc_test", "bayes_logloss_test"))
    assert meta["ctr_train"] > 0 and meta["test_files"] == [
        str(tmp_path / "test" / "part-00000.tsv")
    ]
