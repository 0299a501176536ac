"""``sparseps bench quality --quick``: every family's records, same files, one run.

Two tiny families (10k rows): this checks the records' names, units and baselines and
that the figures are sane, not the quality itself (bench/RESULTS.md has the full grid).
"""

import json
import math

import pytest

from sparseps.benchmarking import load_benchmark
from sparseps.cli import main

pytestmark = pytest.mark.timeout(240)


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
