"""Helpers for the online tests: write a config, run ``sparseps online``, read results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import yaml

from sparseps.testing.environ import clean_environ

ROOT = Path(__file__).resolve().parents[2]
# the module of the test models and losses a job's config names (model.builder, model.loss),
# importable from the checkout that clean_env puts first on PYTHONPATH: a job that names
# them runs in the very environment of every other job of the suite and so is forked from
# the suite's warm zygotes (sparseps.launch.zygote: one pair per distinct environment; a
# PYTHONPATH of its own cost a launch without them and a pair of its own, ~6 CPU-s)
BUILDERS = "tests.online._builders"


def clean_env() -> dict[str, str]:
    """This environment without SPARSEPS_* variables; this checkout first on PYTHONPATH."""
    return clean_environ()


def write_config(path: Path, *, data_root: Path, model_dir: Path, days: int, passes_per_day: int,
                 splits_per_pass: int = 1, start_day: str = "20240101", **sections) -> Path:  # fmt: skip
    config = {
        "job": {"server_num": 1, "worker_num": 2, "mode": "sync", "collective_timeout_s": 120},
        "data": {
            "root": str(data_root),
            "split_minutes": 5,
            "splits_per_pass": splits_per_pass,
            "batch_size": 128,
            "wait_timeout_s": 30,
            "poll_s": 0.1,
        },  # fmt: skip
        "schedule": {"start_day": start_day, "days": days, "passes_per_day": passes_per_day},
        "model": {"emb_dim": 4, "hidden": [16], "dense_lr": 0.01, "deep_lr": 0.05},
        "save": {"model_dir": str(model_dir), "delta_every": 1, "checkpoint_every": 1},
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(config))
    return path


def online_argv(config: Path) -> list[str]:
    return [sys.executable, "-m", "sparseps.cli", "online", str(config)]


def run_online(config: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        online_argv(config), env=clean_env(), capture_output=True, text=True, timeout=timeout,
        cwd=config.parent,
    )  # fmt: skip


def run_crashing(config: Path, phase: str, seq: int, batches: int = 1,
                 timeout: float = 150) -> subprocess.CompletedProcess:  # fmt: skip
    """Launch the job of ``config`` with worker 0 exiting at ``phase`` of pass ``seq``."""
    from sparseps.online.config import load_config
    from sparseps.online.online_cli import launch_argv

    loaded = load_config(config)
    loaded.model_dir.mkdir(parents=True, exist_ok=True)
    argv = launch_argv(loaded, config, script=Path(__file__).with_name("_crash_job.py"),
                       script_args=[phase, seq, batches])  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "sparseps.cli", "launch", *argv], env=clean_env(),
        capture_output=True, text=True, timeout=timeout, cwd=config.parent,
    )  # fmt: skip


def checkpoint_arrays(folder: Path) -> dict[str, np.ndarray]:
    """Every column of every shard (rows sorted by key) and the dense arrays."""
    out = {}
    for path in sorted(folder.glob("*.arrow")):
        table = feather.read_table(path)
        if table.num_rows == 0:
            out[path.name] = np.zeros(0)
            continue
        order = np.argsort(table.column("key").to_numpy())
        for name in table.column_names:
            column = table.column(name).combine_chunks()
            if pa.types.is_fixed_size_list(column.type):
                values = column.flatten().to_numpy().reshape(table.num_rows, -1)
            else:
                values = column.to_numpy(zero_copy_only=False)
            out[f"{path.name}:{name}"] = np.asarray(values)[order]
    with np.load(folder / "dense.npz") as dense:
        out.update({f"dense:{k}": dense[k] for k in dense.files})
    return out


def history(ledger_passes: list[dict]) -> list[tuple]:
    """The comparable part of effective ledger records (no timings, no paths)."""
    keep = ("auc", "logloss", "count", "clicks", "predicted_ctr")
    return [
        (
            r["seq"], r["day"], r["pass"], r["trained"],
            tuple(r["eval"][k] for k in keep),
            tuple(r["train"][k] for k in keep) if r.get("train") else None,
            tuple(sorted(r.get("saved", {}))),
        )
        for r in ledger_passes
    ]  # fmt: skip
