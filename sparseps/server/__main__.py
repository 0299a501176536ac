"""``python -m sparseps.server --rank R --endpoints h:p,h:p [--bind-host H] [--threads N]
[--metrics-port P]``.

Runs one server in the foreground until a ``stop`` op or SIGTERM. Logs go to stderr.
Exit code 0 after a clean stop, 1 with one error line when the server cannot start.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..env import disk_dir_setting, file_roots_setting, recover_setting, replicas_setting
from ..errors import SparsePSError
from ..rpc.protocol import Limits
from ..rpc.security import security_from_env, security_from_key_dir
from .main import DEFAULT_THREADS, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparseps.server", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--rank", type=int, required=True, help="this server's index in --endpoints"
    )
    parser.add_argument(
        "--endpoints",
        required=True,
        help="host:port of every server, comma separated, in rank order",
    )
    parser.add_argument(
        "--bind-host", default=None, help="interface to bind (default: from the endpoint)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"handler threads (default {DEFAULT_THREADS})",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=Limits().max_message_bytes,
        help="largest accepted message; bigger frames are dropped by the transport (default 1 GiB)",
    )
    parser.add_argument(
        "--job-id", default=None, help="refuse requests of any other job (default: accept any)"
    )
    parser.add_argument(
        "--file-root",
        action="append",
        default=None,
        help="a folder save/load may use (repeatable; default: SPARSEPS_FILE_ROOTS, else any)",
    )
    parser.add_argument(
        "--key-dir",
        default=None,
        help="the job's key folder (`sparseps keys DIR`): CURVE transport, only key holders "
        "get in (default: SPARSEPS_SECURE/SPARSEPS_KEY_DIR, else plain)",
    )
    parser.add_argument(
        "--disk-dir",
        default=None,
        help="folder for the rows of tables beyond their memory_rows (default: "
        "SPARSEPS_DISK_DIR; without one such tables are refused)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="backup copies per shard in the job: this server also holds the shards before "
        "its own (default: SPARSEPS_REPLICAS, else 0; docs/replication.md)",
    )
    parser.add_argument(
        "--recover",
        action="store_true",
        help="replace a lost server of a replicated job: copy every shard it holds from a "
        "surviving copy while serving (default: SPARSEPS_RECOVER=1)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics on this port of the bind host, else the endpoint's "
        "host (default: none; "
        "docs/observability.md)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    try:
        if args.metrics_port is not None:
            from ..observe.registry import serve_metrics

            host = args.bind_host or endpoints[args.rank].rsplit(":", 1)[0]
            serve_metrics(args.metrics_port, host)
        limits = Limits(max_message_bytes=args.max_message_bytes)
        serve(
            args.rank, endpoints, bind_host=args.bind_host, threads=args.threads,
            limits=limits, job_id=args.job_id,
            file_roots=args.file_root or file_roots_setting(),
            disk_dir=args.disk_dir or disk_dir_setting(),
            replicas=replicas_setting() if args.replicas is None else args.replicas,
            recover=args.recover or recover_setting(),
            security=security_from_key_dir(args.key_dir) if args.key_dir else security_from_env(),
        )  # fmt: skip
    except SparsePSError as exc:
        print(f"sparseps server {args.rank}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
