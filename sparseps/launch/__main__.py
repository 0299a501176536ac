"""``python -m sparseps.launch ...``: the same as ``sparseps launch ...``.

Builds only the launcher's parser, so it does not import the other sub-commands.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import SparsePSError
from .launch_cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparseps.launch", description="start servers and workers, like fleetrun"
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run(args)
    except SparsePSError as exc:
        print(f"sparseps launch: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
