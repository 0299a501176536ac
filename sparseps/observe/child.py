"""``python -m sparseps.observe.child [--metrics-port P] [--metrics-host H] -- SCRIPT ARGS``.

How the launcher starts every role: register the stack dump on ``SIGUSR1``
(:mod:`sparseps.observe.stacks`, into the job's log dir), serve this process's
``/metrics`` on port ``P`` when given, then run ``SCRIPT`` as ``__main__`` exactly as
``python SCRIPT ARGS`` would (``sys.argv``, ``sys.path[0]`` = the script's folder).
"""

from __future__ import annotations

import argparse
import gc
import logging
import runpy
import sys
from pathlib import Path

from ..env import from_environ
from .registry import serve_metrics
from .stacks import enable_stack_dumps

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sparseps.observe.child")
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    role = from_environ()
    if role is not None:
        enable_stack_dumps(role.log_dir, role.role.value, role.rank)
    if args.metrics_port is not None:
        try:
            serve_metrics(args.metrics_port, args.metrics_host)
        except OSError as exc:  # a taken port costs the metrics, never the job
            print(
                f"sparseps: /metrics not served on {args.metrics_host}:{args.metrics_port}: {exc}",
                file=sys.stderr,
                flush=True,
            )
    script = Path(args.script)
    sys.argv = [args.script, *args.args]
    sys.path[0] = str(script.resolve().parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        # The interpreter's last collections walk every object the role made, torch's
        # modules first: 1.2-3 s of CPU per torch process at exit on a loaded box. Frozen,
        # they are left alone; what the role opened is still closed (atexit handlers,
        # reference counts).
        gc.freeze()


if __name__ == "__main__":
    main()
