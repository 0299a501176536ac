"""Progress bars of long command-line work (tqdm, on stderr), one rule for every command.

A bar shows only when stderr is a terminal; ``--progress`` / ``--no-progress``
(:func:`add_argument`) force it on or off. Off, nothing is written: logs and captured
output hold no carriage return or escape code. Lines a command prints while its bar is
up go through :func:`write`, which keeps the bar below them.

Used by ``sparseps demo`` (its phases and the rows trained) and ``sparseps inspect``
(bytes verified); ``sparseps gen-data`` follows the same rule.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

__all__ = ["add_argument", "bar", "write"]


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (default None: on when stderr is a terminal)."""
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="a progress bar on stderr (default: only when stderr is a terminal)",
    )  # fmt: skip


def bar(enabled: bool | None, **options: Any):
    """A ``tqdm`` bar on stderr; ``enabled`` None: only when stderr is a terminal.

    Args:
        enabled: the command's ``--progress`` value.
        options: passed to ``tqdm`` (``total``, ``unit``, ``desc``...).
    """
    from tqdm import tqdm

    disable = None if enabled is None else not enabled  # tqdm: None = off unless a TTY
    return tqdm(file=sys.stderr, disable=disable, dynamic_ncols=True, **options)


def write(line: str, *, file: IO[str] | None = None) -> None:
    """Print ``line`` (to stdout by default) above any bar that is up."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout if file is None else file)
