"""The learnable limit of a ``bench quality`` family: what the same model shape reaches
when it may see the training rows as often as it likes.

One pass over 1M rows leaves every system 0.06-0.07 test AUC below the planted (Bayes)
model; this reference says how much of that gap the data allows a wide&deep of this shape
to close. It trains :class:`e2e.TorchWideDeep` (the in-process baseline of ``bench
quality``, same tables, head and batch) for several passes:

- a validation split is cut from the training files (the last ``VALIDATION_SHARE`` of the
  rows of each), the model trains on the rest;
- each setting of ``SETTINGS`` (learning rates) trains up to ``MAX_EPOCHS`` passes,
  evaluated on validation after each, and stops once ``PATIENCE`` passes in a row bring
  no better validation AUC (early stopping);
- the chosen setting and pass are the best validation AUC; the test figures reported are
  that model's, so the test files never take part in a choice.

``python bench/_learnable.py --family ctr15% --rows 1000000`` runs it alone (what
bench/RESULTS.md used while the peers ran).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sparseps.benchmarking import load_benchmark

VALIDATION_SHARE = 0.1
MAX_EPOCHS, PATIENCE = 3, 1
# the one-pass rates of bench quality's torch baseline, then a third of them, then that
# with the id tables frozen after the first pass (``freeze_tables_after``: later passes
# train the dense part only): at 1M rows every second pass that moves the hashed id
# tables overfits them (bench/RESULTS.md), at any of these rates
SETTINGS: tuple[dict[str, float], ...] = (
    {"deep_lr": 0.01, "wide_lr": 0.01, "dense_lr": 0.001},
    {"deep_lr": 0.003, "wide_lr": 0.003, "dense_lr": 0.0003},
    {"deep_lr": 0.003, "wide_lr": 0.003, "dense_lr": 0.0003, "freeze_tables_after": 1},
)


def split_validation(folder: Path, share: float = VALIDATION_SHARE) -> tuple[Path, Path]:
    """``(fit, validation)`` folders cut from ``folder/train``: the last ``share`` of each
    file's rows go to validation, the rest to fit (made once, kept beside the data)."""
    if not 0 < share < 1:
        raise ValueError(f"the validation share must lie in (0, 1), not {share}")
    out = folder / f"learnable-split-{share:g}"
    fit, validation = out / "fit", out / "validation"
    if (out / "done").is_file():
        return fit, validation
    fit.mkdir(parents=True, exist_ok=True)
    validation.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in (folder / "train").iterdir() if p.is_file())
    if not files:
        raise FileNotFoundError(f"no training files in {folder / 'train'}")
    for path in files:
        with path.open("rb") as f:
            rows = sum(1 for _ in f)
        keep = rows - max(1, int(rows * share))
        with (
            path.open("rb") as src,
            (fit / path.name).open("wb") as a,
            (validation / path.name).open("wb") as b,
        ):
            for i, line in enumerate(src):
                (a if i < keep else b).write(line)
    (out / "done").write_text("")
    return fit, validation


def _e2e():
    return load_benchmark("e2e")


def freeze_tables(model) -> None:
    """From now on ``model`` (a ``TorchWideDeep``) trains its dense part only: no gradient
    for the id tables, and only the dense optimizer steps."""
    model.deep.weight.requires_grad_(False)
    model.wide.weight.requires_grad_(False)
    model.optimizers = model.optimizers[:1]


def train_setting(folder: Path, fit: Path, validation: Path, setting: dict[str, float], *,
                  hash_rows: int, max_epochs: int = MAX_EPOCHS, patience: int = PATIENCE,
                  log: Callable[..., None] = print) -> dict:  # fmt: skip
    """One setting: passes over ``fit`` until validation AUC stops rising. Returns the
    per-pass ``curve`` (validation and test figures) and ``best``, the pass with the best
    validation AUC."""
    rates = {k: v for k, v in setting.items() if k != "freeze_tables_after"}
    freeze_after = setting.get("freeze_tables_after")
    model = _e2e().TorchWideDeep(hash_rows=hash_rows, **rates)
    curve: list[dict] = []
    best: dict | None = None
    for epoch in range(1, max_epochs + 1):
        if freeze_after is not None and epoch == freeze_after + 1:
            freeze_tables(model)
        samples, seconds = model.train_pass([fit])
        val = model.evaluate([validation])
        test = model.evaluate([folder / "test"])
        point = {"epoch": epoch, "val_auc": val["test_auc"], "val_logloss": val["test_logloss"],
                 **test, "samples_per_s": samples / seconds}  # fmt: skip
        curve.append(point)
        log(f"learnable {setting} epoch {epoch}: val auc {point['val_auc']:.4f} | test auc "
            f"{test['test_auc']:.4f} ll {test['test_logloss']:.4f} copc {test['test_copc']:.3f}",
            flush=True)  # fmt: skip
        if best is None or point["val_auc"] > best["val_auc"]:
            best = point
        elif epoch - best["epoch"] >= patience:
            break
    assert best is not None  # max_epochs >= 1
    return {"setting": setting, "curve": curve, "best": best}


def learnable(folder: Path, *, hash_rows: int, settings=SETTINGS, max_epochs: int = MAX_EPOCHS,
              patience: int = PATIENCE, share: float = VALIDATION_SHARE,
              log: Callable[..., None] = print) -> dict:  # fmt: skip
    """The learnable-limit reference on a family's files: the test figures of the setting
    and pass with the best validation AUC (``test_auc``, ``test_logloss``, ``test_copc``,
    ``val_auc``, ``epochs``, ``setting``) and every setting's curve (``trials``)."""
    if max_epochs < 1 or patience < 1:
        raise ValueError(f"max_epochs and patience must be >= 1 ({max_epochs}, {patience})")
    fit, validation = split_validation(folder, share)
    start = time.perf_counter()
    trials = [
        train_setting(folder, fit, validation, setting, hash_rows=hash_rows,
                      max_epochs=max_epochs, patience=patience, log=log)
        for setting in settings
    ]  # fmt: skip
    chosen = max(trials, key=lambda t: t["best"]["val_auc"])
    best = chosen["best"]
    return {
        "test_auc": best["test_auc"],
        "test_logloss": best["test_logloss"],
        "test_copc": best["test_copc"],
        "val_auc": best["val_auc"],
        "epochs": best["epoch"],
        "setting": chosen["setting"],
        "trials": trials,
        "wall_s": time.perf_counter() - start,
    }


def _quality():
    path = Path(__file__).with_name("quality.py")
    spec = importlib.util.spec_from_file_location("sparseps_bench_quality", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    quality = _quality()
    p = argparse.ArgumentParser(description="the learnable limit of bench quality's families")
    p.add_argument("--families", default="ctr15%", help="comma-separated names")
    p.add_argument("--seed", type=int, default=quality.REPORT_SEEDS[0])
    p.add_argument("--rows", type=int, default=quality.REPORT_ROWS)
    p.add_argument("--test-rows", type=int, default=quality.TEST_ROWS)
    p.add_argument("--max-epochs", type=int, default=MAX_EPOCHS)
    p.add_argument(
        "--settings", default="",
        help="comma-separated indices into SETTINGS to train (default: all of them)",
    )  # fmt: skip
    p.add_argument("--out", default="", help="append one JSON line per family here")
    args = p.parse_args(argv)
    settings = SETTINGS
    if args.settings:
        try:
            settings = tuple(SETTINGS[int(i)] for i in args.settings.split(","))
        except (ValueError, IndexError):
            p.error(f"--settings {args.settings!r}: expected indices in 0..{len(SETTINGS) - 1}")
    for family in args.families.split(","):
        folder, meta = quality.data(family, args.seed, args.rows, args.test_rows)
        got = learnable(folder, hash_rows=quality.HASH_ROWS, settings=settings,
                        max_epochs=args.max_epochs)  # fmt: skip
        line = {"family": family, "seed": args.seed, "rows": args.rows,
                "bayes_auc": meta["bayes_auc_test"], **got}  # fmt: skip
        print(json.dumps({k: v for k, v in line.items() if k != "trials"}), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
