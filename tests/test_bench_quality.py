"""``sparseps bench quality --quick``: every family's records, same files, one run.

Two tiny families (10k rows): this checks the records' names, units and baselines and
that the figures are sane, not the quality itself (bench/RESULTS.md has the full grid).
The learnable limit and the TensorFlow peer are checked on one grid run of one family
(``tiny_grid``): the demo job is launched once for both.
"""

import json
import math

import pytest
import torch

from sparseps.benchmarking import load_benchmark
from sparseps.cli import main

# generous: the box these run on is often shared (load 10-20 stretches a 60 s run to 4 min)
pytestmark = pytest.mark.timeout(600)

TINY_FAMILY = "ctr25%"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The in-process torch models here (the torch baseline, the learnable limit) on one
    intra-op thread, as the demo job's workers are: on two cores shared with the rest of
    the suite, two threads spin-waiting on each other made the learnable limit ~10x
    slower (9 passes: 207 s against 21 s at load 11). Only the threads change, not a
    figure a check reads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_grid(one_torch_thread):
    """One grid run on ``TINY_FAMILY`` at 10k rows: the demo job, the learnable limit and
    the TensorFlow peer when its venv is here. The records by metric name, whether the
    peer was run, and the grid's log (where a failing peer says why)."""
    bench = _quality()
    tf = bench.tf_peer() is not None
    lines: list[str] = []
    records = bench.grid((TINY_FAMILY,), bench.REPORT_SEEDS, rows=bench.QUICK_ROWS,
                         test_rows=bench.QUICK_TEST_ROWS, hash_rows=bench.QUICK_HASH_ROWS,
                         torch_baseline=False, paddle=False, tf=tf, learnable=True,
                         log=lambda *a, **k: lines.append(" ".join(map(str, a))))  # fmt: skip
    return {r.metric: r for r in records}, tf, lines


def test_bench_quality_quick_records(capsys):
    assert main(["bench", "quality", "--quick", "--json"]) == 0
    out = capsys.readouterr()
    records = json.loads(out.out.strip().splitlines()[-1])
    bench = load_benchmark("quality")
    by_name = {r["metric"]: r for r in records}
    for family in bench.QUICK_FAMILIES:
        for metric in ("test_auc", "test_logloss", "copc", "samples_per_s"):
            record = by_name[f"{metric}[{family}]"]
            assert record["baseline"] is not None and math.isfinite(record["baseline"])
            assert math.isclose(record["ratio"], record["value"] / record["baseline"])
            assert record["params"]["family"] == family
            assert record["params"]["seed"] in bench.REPORT_SEEDS
        bayes = by_name[f"bayes_auc[{family}]"]
        assert 0.75 < bayes["value"] < 0.95 and bayes["baseline"] is None
        assert 0.5 < by_name[f"test_auc[{family}]"]["value"] <= bayes["value"] + 0.02
        assert math.isfinite(by_name[f"copc[{family}]"]["value"])
        ctr = bayes["params"]["ctr_test"]
        assert ctr == pytest.approx(bench.FAMILIES[family]["click_rate"], rel=0.3)
    # --quick never runs the peer (about 80 s a family) and says so
    assert "the Paddle peer is not run" in out.err
    assert not any(name.startswith("paddle_") for name in by_name)
    assert "the TensorFlow peer is not run" in out.err
    assert not any(name.startswith("tf_") for name in by_name)


def _quality():
    return load_benchmark("quality")


@pytest.mark.timeout(900)
def test_learnable_limit_tiny_data(tiny_grid):
    """The learnable-limit reference on a 10k-row family: each setting's chosen pass is its
    best on validation (so never worse than its first pass), early stopping ends a setting
    once a pass brings nothing, the chosen setting is the best on validation, and the
    reported test figures are the chosen model's. It comes out as ``learnable_auc[F]``
    beside the one-pass job, in the same grid run."""
    bench = _quality()
    family = TINY_FAMILY
    by_name, _, _ = tiny_grid
    record = by_name[f"learnable_auc[{family}]"]
    assert record.baseline == by_name[f"test_auc[{family}]"].value  # sparseps, one pass
    params = record.params
    curves = params["learnable_curves"]
    assert [c["setting"] for c in curves] == list(bench._learnable().SETTINGS)
    limit = bench._learnable()
    best_per_setting = []
    for curve in curves:
        val = curve["val_auc"]
        assert 1 <= len(val) <= limit.MAX_EPOCHS
        best = max(val)
        assert best >= val[0]  # more passes never give a worse validation AUC than the first
        if len(val) < limit.MAX_EPOCHS:  # stopped early: the last PATIENCE passes brought nothing
            assert all(v <= best for v in val[-limit.PATIENCE :])
            assert val.index(best) == len(val) - 1 - limit.PATIENCE
        best_per_setting.append(best)
    chosen = curves[best_per_setting.index(max(best_per_setting))]
    assert params["learnable_setting"] == chosen["setting"]
    assert round(params["learnable_val_auc"], 4) == max(best_per_setting)
    assert params["learnable_epochs"] == chosen["val_auc"].index(max(chosen["val_auc"])) + 1
    assert 0.5 < record.value <= by_name[f"bayes_auc[{family}]"].value + 0.02
    assert math.isfinite(params["learnable_test_logloss"])


def test_validation_split_cuts_the_tail_of_each_training_file(tmp_path):
    bench = _quality()
    folder, _ = bench.data("ctr25%", bench.REPORT_SEEDS[0], bench.QUICK_ROWS,
                           bench.QUICK_TEST_ROWS)  # fmt: skip
    fit, validation = bench._learnable().split_validation(folder, 0.1)
    for path in sorted((folder / "train").iterdir()):
        lines = path.read_bytes().splitlines(keepends=True)
        head, tail = (fit / path.name).read_bytes(), (validation / path.name).read_bytes()
        assert head + tail == b"".join(lines)
        assert tail.count(b"\n") == int(len(lines) * 0.1)
    with pytest.raises(ValueError, match="validation share"):
        bench._learnable().split_validation(folder, 1.5)


def test_peer_last_line_parsed_and_failures_raise(tmp_path):
    """A peer's last line read into our keys (a figure it prints as None is NaN); a peer
    that fails raises with its output, and the grid records nothing for it."""
    bench = _quality()
    ok = tmp_path / "ok.sh"
    ok.write_text("echo starting >&2\necho 'tf_ps samples_per_s=1234 auc=0.7766 rows=10 "
                  "test_logloss=None wall_s=3.0'\n")  # fmt: skip
    got = bench.run_tf(ok, tmp_path)
    assert got["samples_per_s"] == 1234 and got["test_auc"] == 0.7766
    assert math.isnan(got["test_logloss"])
    bad = tmp_path / "bad.sh"
    bad.write_text("echo 'ImportError: no tensorflow' >&2\nexit 3\n")
    with pytest.raises(RuntimeError, match="no tensorflow"):
        bench.run_tf(bad, tmp_path)
    lines: list[str] = []
    assert bench._peer_or_none(bench.run_tf, bad, tmp_path, lines.append) is None
    assert "exit 3" in lines[0]


@pytest.mark.timeout(900)
def test_tf_peer_beside_sparseps_quick(tiny_grid):
    """The TensorFlow peer on the same 10k-row files as the demo job, one grid run: its
    ``tf_*`` records (value: sparseps, baseline: TF). Needs the peer's venv."""
    bench = _quality()
    by_name, tf, lines = tiny_grid
    if not tf:
        pytest.skip(
            f"no TensorFlow peer venv (tensorflow-cpu and tf-keras {bench.TF_VERSION} at "
            "$TF_VENV or /tmp/tf-venv; ../shared/peers/tf/run.sh makes it on first use)"
        )
    family = TINY_FAMILY
    assert f"tf_test_auc[{family}]" in by_name, lines  # a failing peer is only logged
    ours = by_name[f"test_auc[{family}]"].value
    auc, logloss, speed = (by_name[f"tf_{m}[{family}]"] for m in
                           ("test_auc", "test_logloss", "samples_per_s"))  # fmt: skip
    assert auc.value == ours and 0.5 < auc.baseline < 0.95
    assert 0 < logloss.baseline < 1 and speed.baseline > 0
    assert auc.params["tf_samples_per_s"] == speed.baseline


def test_frozen_tables_stay_put_while_the_dense_part_trains():
    """``freeze_tables_after``: after the freeze a pass moves the head, not the id tables."""
    bench = _quality()
    folder, _ = bench.data("ctr25%", bench.REPORT_SEEDS[0], bench.QUICK_ROWS,
                           bench.QUICK_TEST_ROWS)  # fmt: skip
    model = load_benchmark("e2e").TorchWideDeep(hash_rows=bench.QUICK_HASH_ROWS)
    model.train_pass([folder / "test"])
    bench._learnable().freeze_tables(model)
    deep, wide = model.deep.weight.clone(), model.wide.weight.clone()
    head = [p.detach().clone() for p in model.head.parameters()]
    model.train_pass([folder / "test"])
    assert (model.deep.weight == deep).all() and (model.wide.weight == wide).all()
    assert any((p != q).any() for p, q in zip(model.head.parameters(), head, strict=True))


def test_learnable_cli_trains_only_the_settings_asked_for(tmp_path, capsys):
    """``bench/_learnable.py --settings 1``: one setting of SETTINGS (what a short report
    run uses), its line appended to ``--out``; an index outside SETTINGS is refused."""
    limit = _quality()._learnable()
    out = tmp_path / "limit.jsonl"
    assert limit.main(["--families", "ctr25%", "--rows", "10000", "--test-rows", "4000",
                       "--settings", "1", "--max-epochs", "1", "--out", str(out)]) == 0  # fmt: skip
    line = json.loads(out.read_text())
    assert line["setting"] == limit.SETTINGS[1]
    assert [t["setting"] for t in line["trials"]] == [limit.SETTINGS[1]]
    assert line["epochs"] == 1 and 0.5 < line["test_auc"] < 1
    with pytest.raises(SystemExit):
        limit.main(["--settings", str(len(limit.SETTINGS))])
    assert "expected indices in 0.." in capsys.readouterr().err
