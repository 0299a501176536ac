"""The ``sparseps`` command line: one entry point, one module per sub-command.

Each sub-command lives in its own module, which defines ``add_arguments(parser)`` and
``run(args) -> int``; this file only lists them, so adding a command is one line here.
Only the chosen command's module is imported; command modules keep heavy imports
(torch, numba) inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .errors import SparsePSError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("sparseps.benchmarking", "run a benchmark from bench/ and print ratios"),
    "demo": ("sparseps.demo", "the main job: data, 1 server + 2 workers, wide&deep, test AUC"),
    "inspect": (
        "sparseps.checkpoint.inspect_cli",
        "what a model directory holds; exit 0 if it verifies",
    ),
    "predict": (
        "sparseps.checkpoint.predict_cli",
        "predictions from an inference model, without servers",
    ),
    "serve": (
        "sparseps.serving.serve_cli",
        "an HTTP prediction service that follows an inference model's chain",
    ),
    "launch": ("sparseps.launch.launch_cli", "start servers and workers, like fleetrun"),
    "scale": (
        "sparseps.launch.scale_cli",
        "grow or shrink a running launched job's servers (and workers) while it trains",
    ),
    "k8s": ("sparseps.launch.k8s", "Kubernetes manifests of a job (Indexed Jobs, a Service)"),
    "diagnose": (
        "sparseps.observe.diagnose",
        "dump the stacks of every live role of a job; who waits on whom",
    ),
    "keys": ("sparseps.rpc.keys_cli", "write a job key pair for --secure transport"),
    "gen-data": ("sparseps.data.gen_cli", "synthetic Criteo-format data from a planted model"),
    "import-paddle": (
        "sparseps.models.import_paddle_cli",
        "a Paddle PS save (CTR-accessor tables, wide&deep) into a sparseps checkpoint",
    ),
    "online": (
        "sparseps.online.online_cli",
        "streaming training in passes over time-partitioned data",
    ),
    "build-index": (
        "sparseps.recall.build_cli",
        "a faiss index from dumped item vectors (extra: sparseps[recall])",
    ),
}


def _parser(command: str | None) -> argparse.ArgumentParser:
    """The parser; only the chosen command's module is imported (one broken command
    module cannot take the others down)."""
    parser = argparse.ArgumentParser(prog="sparseps", description="sparseps parameter server")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def _command(argv: list[str]) -> str | None:
    """The first argument naming a command (skipping ``--log-level VALUE``)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--log-level":
            skip = True
        elif arg in COMMANDS:
            return arg
        elif not arg.startswith("-"):
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser(_command(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except SparsePSError as exc:
        print(f"sparseps {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"sparseps {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
