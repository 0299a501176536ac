"""``sparseps bench NAME``: run ``bench/NAME.py`` and report ratios against a baseline.

A benchmark module in ``bench/`` defines ``run(quick: bool) -> list[BenchRecord]`` (and
takes ``secure=True`` / ``replicas=R`` if it supports ``--secure`` / ``--replicas``); every
record carries the baseline measured in the same run, so the ratio means something on a
shared, noisy machine. With ``--json`` the last stdout line is the JSON list of records
(DESIGN §2.1).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import types
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import ConfigError

__all__ = ["BenchRecord", "bench_dir", "load_benchmark", "run"]


@dataclass(frozen=True)
class BenchRecord:
    """One measured figure: ``ratio = value / baseline`` (both measured in the same run)."""

    metric: str
    value: float
    unit: str
    baseline: float | None = None
    params: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    def to_json(self) -> dict:
        record = asdict(self)
        record["ratio"] = self.ratio
        return {k: record[k] for k in ("metric", "value", "unit", "baseline", "ratio", "params")}

    def line(self) -> str:
        ratio = f"  ratio {self.ratio:.2f} (baseline {self.baseline:.4g})" if self.ratio else ""
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.metric:<24} {self.value:>14.4g} {self.unit:<10}{ratio}  [{params}]"


def bench_dir() -> Path:
    """The repository's ``bench/`` folder (the package is installed editable from it)."""
    return Path(__file__).resolve().parent.parent / "bench"


def available() -> list[str]:
    folder = bench_dir()
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def load_benchmark(name: str) -> types.ModuleType:
    path = bench_dir() / f"{name}.py"
    if not path.is_file():
        raise ConfigError(
            f"no benchmark named {name!r} in {bench_dir()} (available: {', '.join(available())})"
        )
    spec = importlib.util.spec_from_file_location(f"sparseps_bench_{name}", path)
    if spec is None or spec.loader is None:  # a .py file always has a spec and a loader
        raise ConfigError(f"cannot import benchmark {name!r} from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="benchmark name: a file bench/NAME.py")
    parser.add_argument("--json", action="store_true", help="last stdout line is JSON records")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="also measure CURVE-secured transport against plain (benchmarks that use servers)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="R",
        help="measure servers keeping R backup copies per shard against none, and the "
        "failover time (benchmarks that use servers: rpc)",
    )
    parser.add_argument(
        "--backend",
        choices=["local", "ray"],
        default=None,
        help="e2e: also run the job through `sparseps launch --backend ray` and compare it "
        "with the local launcher (docs/cluster.md)",
    )


def run(args: argparse.Namespace) -> int:
    module = load_benchmark(args.name)
    options: dict[str, object] = {}
    if args.secure:
        options["secure"] = True
    if args.replicas is not None:
        options["replicas"] = args.replicas
    if args.backend is not None:
        options["backend"] = args.backend
    for name in options:  # each option goes only to a benchmark that takes it
        if name not in inspect.signature(module.run).parameters:
            raise ConfigError(f"bench {args.name}: --{name} is not supported by this benchmark")
    records: list[BenchRecord] = module.run(quick=args.quick, **options)
    for record in records:
        print(record.line(), flush=True)
    if args.json:
        sys.stdout.write(json.dumps([r.to_json() for r in records]) + "\n")
    return 0
