"""The CTR accessor's trade-off curve: embedx_threshold against memory and test AUC.

On the families of ``sparseps bench quality`` (its data files and its report seed), the
demo job (1 server + 2 workers, async, one pass) with today's defaults (twice: async
training is not deterministic, the second run shows the run-to-run noise), then with
``--cvm`` alone (``--cvm-alone``) and with ``--cvm`` and one CTR-accessor table at each threshold
(``--embedx-threshold T``): test AUC and the tables' bytes on the server
(``table_bytes``). Not a registered benchmark (a leading underscore); run it by path:

    python bench/_accessor_curve.py --rows 100000 --test-rows 100000 --out curve.jsonl

Each line of output (and of ``--out``, appended as it goes) is one run: family, run,
test AUC, the AUC against the defaults' first run, bytes, bytes against the defaults',
rows and rows with an embedx part. The end prints markdown tables (``--summarize FILE``
prints them from an ``--out`` file): each run's AUC against the mean of the family's two
defaults runs and its bytes against the defaults', then per run the mean and worst gap
over the families.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

THRESHOLDS = (1.0, 2.0, 5.0, 10.0)


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


def runs(thresholds: list[float], extra: str = "", *, cvm_alone: bool = False
         ) -> list[tuple[str, str]]:  # fmt: skip
    """``(name, demo job flags)`` of one family's runs, the defaults first."""
    return (
        [("defaults", ""), ("defaults again", "")]
        + ([("cvm", "--cvm")] if cvm_alone else [])
        + [(f"cvm+threshold {t:g}", f"--cvm --embedx-threshold {t:g} {extra}".strip())
           for t in thresholds]
    )  # fmt: skip


def summary(records: list[dict]) -> str:
    """Markdown tables: per family and run, the test AUC against the mean of the family's
    defaults runs and the bytes against the defaults'; then per run over the families,
    the mean and worst AUC gap and the largest bytes ratio."""
    families = list(dict.fromkeys(r["family"] for r in records))
    names = [n for n in dict.fromkeys(r["run"] for r in records) if not n.startswith("defaults")]
    base = {}
    for family in families:
        runs = [r for r in records if r["family"] == family and r["run"].startswith("defaults")]
        base[family] = (sum(r["test_auc"] for r in runs) / len(runs), runs[0]["bytes"],
                        max(r["test_auc"] for r in runs) - min(r["test_auc"] for r in runs))  # fmt: skip
    head = "| family | defaults AUC (2 runs' spread) | " + " | ".join(names) + " |"
    lines = [head, "|---" * (2 + len(names)) + "|"]
    gaps: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    for family in families:
        auc, nbytes, spread = base[family]
        cells = []
        for name in names:
            got = [r for r in records if r["family"] == family and r["run"] == name]
            if not got:
                cells.append("")
                continue
            r = got[0]
            gap, ratio = r["test_auc"] - auc, r["bytes"] / nbytes
            gaps[name].append((gap, ratio, r["embedx_rows"] / max(r["rows"], 1)))
            cells.append(f"{r['test_auc']:.4f} ({gap:+.4f}), {ratio:.2f}x")
        lines.append(f"| {family} | {auc:.4f} ({spread:.4f}) | " + " | ".join(cells) + " |")
    lines += ["", "| run | families | mean AUC gap | worst AUC gap | gaps below -0.002 | "
              "max bytes ratio | mean embedx share |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        got = gaps[name]
        if got:
            worst = min(g for g, _, _ in got)
            lines.append(f"| {name} | {len(got)} | {sum(g for g, _, _ in got) / len(got):+.4f} | "
                         f"{worst:+.4f} | {sum(g < -0.002 for g, _, _ in got)} | "
                         f"{max(b for _, b, _ in got):.3f} | "
                         f"{sum(e for _, _, e in got) / len(got):.3f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    quality = _quality()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(quality.FAMILIES))
    ap.add_argument("--rows", type=int, default=quality.ROWS)
    ap.add_argument("--test-rows", type=int, default=quality.TEST_ROWS)
    ap.add_argument("--seed", type=int, default=quality.REPORT_SEEDS[0])
    ap.add_argument("--thresholds", default=",".join(f"{t:g}" for t in THRESHOLDS))
    ap.add_argument("--extra", default="", help="more demo flags for the threshold runs")
    ap.add_argument("--cvm-alone", action="store_true", help="also --cvm without a threshold")
    ap.add_argument("--out", default="", help="append each run's JSON line to this file")
    ap.add_argument(
        "--summarize", default="", help="print the tables of an --out file, run nothing"
    )
    args = ap.parse_args()
    if args.summarize:
        with open(args.summarize, encoding="utf-8") as f:
            print(summary([json.loads(line) for line in f if line.strip()]))
        return
    thresholds = [float(x) for x in args.thresholds.split(",") if x]
    records = []
    for family in args.families.split(","):
        folder, meta = quality.data(family, args.seed, args.rows, args.test_rows)
        base = None
        for name, job_args in runs(thresholds, args.extra, cvm_alone=args.cvm_alone):
            result = quality.run_sparseps(folder, job_args)
            nbytes, rows, embedx = _figures(result)
            if base is None:
                base = (result["test_auc"], nbytes)
            record = {"family": family, "seed": args.seed, "rows_train": args.rows,
                      "run": name, "flags": job_args, "test_auc": round(result["test_auc"], 5),
                      "auc_gap": round(result["test_auc"] - base[0], 5),
                      "test_logloss": round(result["test_logloss"], 5), "bytes": nbytes,
                      "bytes_ratio": round(nbytes / base[1], 4), "rows": rows,
                      "embedx_rows": embedx, "bayes_auc": round(meta["bayes_auc_test"], 4)}  # fmt: skip
            records.append(record)
            print(json.dumps(record), flush=True)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
    print(summary(records), flush=True)


if __name__ == "__main__":
    main()
