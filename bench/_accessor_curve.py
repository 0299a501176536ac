"""The CTR accessor's trade-off curve: embedx_threshold against memory and test AUC.

On families of ``sparseps bench quality`` (the same data files, one seed), the demo job
(1 server + 2 workers, async, one pass) with today's defaults, then with ``--cvm`` and a
split table at each threshold (``--embedx-threshold T``): test AUC and the tables' bytes
on the server (``table_bytes``). Not a registered benchmark (a leading underscore); run
it by path:

    python bench/_accessor_curve.py --families ctr4%,ctr25% --rows 100000 --json

Each line of output is one run: family, configuration, test AUC, the AUC against the
defaults', bytes, bytes against the defaults', rows and rows with an embedx part.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

THRESHOLDS = (0.0, 0.2, 0.5, 1.0, 2.0)


def _quality():
    path = Path(__file__).with_name("quality.py")
    spec = importlib.util.spec_from_file_location("sparseps_bench_quality", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _figures(result: dict) -> tuple[int, int, int]:
    tables = result["table_bytes"].values()
    return (sum(t["bytes"] for t in tables), sum(t["rows"] for t in tables),
            sum(t["embedx_rows"] for t in tables))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="ctr4%,ctr25%")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--test-rows", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=101)
    ap.add_argument("--thresholds", default=",".join(str(t) for t in THRESHOLDS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    quality = _quality()
    out = []
    for family in args.families.split(","):
        folder, meta = quality.data(family, args.seed, args.rows, args.test_rows)
        runs = (
            [("defaults", "")]
            + [("cvm", "--cvm")]
            + [
                (f"cvm+threshold {t}", f"--cvm --embedx-threshold {t}")
                for t in (float(x) for x in args.thresholds.split(","))
            ]
        )
        base = None
        for name, job_args in runs:
            result = quality.run_sparseps(folder, job_args)
            nbytes, rows, embedx = _figures(result)
            if base is None:
                base = (result["test_auc"], nbytes)
            record = {"family": family, "run": name, "test_auc": round(result["test_auc"], 4),
                      "auc_gap": round(result["test_auc"] - base[0], 4), "bytes": nbytes,
                      "bytes_ratio": round(nbytes / base[1], 3), "rows": rows,
                      "embedx_rows": embedx, "bayes_auc": round(meta.get("bayes_auc", 0), 4)}  # fmt: skip
            out.append(record)
            print(json.dumps(record) if args.json else record, flush=True)


if __name__ == "__main__":
    main()
