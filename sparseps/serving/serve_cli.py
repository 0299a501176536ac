"""``sparseps serve MODEL_DIR [--port P] [--host H]``: the prediction service.

Serves the inference chain in ``MODEL_DIR`` over HTTP and follows it: each new delta
(and a new base) is applied while serving (docs/serving.md).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="inference model folder (trainer.save_inference_model)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: a free one)")
    parser.add_argument(
        "--schema",
        default=None,
        help="request columns: criteo, criteo_slot, avazu or a JSON file of Schema fields "
        "(default: the schema the model records; Criteo for a save that records none)",
    )
    parser.add_argument(
        "--poll-s", type=float, default=1.0, help="seconds between checks for new saves (default 1)"
    )
    parser.add_argument(
        "--max-body-mb", type=float, default=64.0, help="larger bodies get 413 (default 64)"
    )
    parser.add_argument(
        "--max-rows",
        type=int,
        default=65536,
        help="requests with more rows get 413 (default 65536)",
    )
    parser.add_argument(
        "--max-ids",
        type=int,
        default=1 << 21,
        help="requests with more feature ids (all slots together) get 413 (default 2097152)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads per request (default 1: requests run in parallel)",
    )
    parser.add_argument(
        "--ready-file", default=None, help="write {url, host, port, pid} here once listening"
    )
    parser.add_argument(
        "--batch-max-rows",
        type=int,
        default=1024,
        help="rows one model call gathers from concurrent requests at most (default 1024; "
        "0: no batching, a call per request)",
    )
    parser.add_argument(
        "--batch-max-wait-ms",
        type=float,
        default=2.0,
        help="the longest a request waits for others to join its model call (default 2 ms; "
        "no wait when no other request is on its way)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="service processes on the one port, sharing the model's memory-mapped rows "
        "(default 0: one per core)",
    )
    parser.add_argument(
        "--index-dir",
        default=None,
        help="where the bases' sorted-key row indexes are kept and shared by the workers "
        "(default: MODEL_DIR/.serving-index)",
    )
    # a worker process of --workers N: serve the connections handed over on this fd
    parser.add_argument("--channel-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--board", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from .config import ServeConfig
    from .server import serve

    config = ServeConfig(
        model_dir=args.directory,
        host=args.host,
        port=args.port,
        schema=args.schema,
        poll_s=args.poll_s,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        max_rows=args.max_rows,
        max_ids=args.max_ids,
        torch_threads=args.torch_threads,
        ready_file=args.ready_file,
        batch_max_rows=args.batch_max_rows,
        batch_max_wait_ms=args.batch_max_wait_ms,
        workers=args.workers,
        index_dir=args.index_dir,
    )
    if args.channel_fd is not None:  # one worker of a supervisor (sparseps.serving.workers)
        from .workers import WorkerPlace

        serve(config, WorkerPlace(args.channel_fd, args.worker_index, args.board))
    elif config.processes > 1:
        from .workers import supervise

        return supervise(config)
    else:
        serve(config)
    return 0
