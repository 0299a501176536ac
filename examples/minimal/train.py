"""The smallest sparseps job: every worker pushes known gradients, then checks the rows.

Runs unchanged alone (local mode: one background server, one worker) and under the
launcher (fleetrun semantics: the same script on every server and worker)::

    python examples/minimal/train.py
    sparseps launch --server-num 2 --worker-num 2 examples/minimal/train.py

With SGD (``row -= lr * grad``) and worker ``w`` pushing ``(w + 1) * g`` for ``rounds``
rounds, every row must end at ``initial - lr * rounds * (1 + 2 + ... + W) * g``,
whatever the number of servers. The script exits 1 if it does not.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

import sparseps as sps

log = logging.getLogger("minimal")

DIM = 4
LR = 0.5  # a power of two keeps the expected values exact in float32
# Small and very large ids: uint64 keys use the whole range.
KEYS = np.array([1, 7, 42, 2**33 + 5, 2**63 + 11, 2**64 - 1], dtype=np.uint64)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="pushes per worker")
    parser.add_argument("--out", default="", help="folder for worker.R.json result files")
    return parser.parse_args(argv)


def train(rounds: int) -> dict:
    """Push known gradients from this worker; returns what it saw and expected."""
    rank, world = sps.worker_index(), sps.worker_num()
    direction = np.arange(1, DIM + 1, dtype=np.float32)  # one gradient row: [1, 2, 3, 4]
    with sps.PSClient(sps.server_endpoints(), timeout=60) as client:
        client.create_table(sps.TableConfig(name="emb", dim=DIM, rule=sps.optim.SGD(lr=LR)))
        before = client.pull("emb", KEYS).wait()
        sps.barrier_worker()  # every worker has read the initial rows before any push
        grads = np.tile((rank + 1) * direction, (len(KEYS), 1))
        for _ in range(rounds):
            client.push("emb", KEYS, grads).wait()
        sps.barrier_worker()  # every worker's pushes are applied
        after = client.pull("emb", KEYS).wait()
    expected = before - LR * rounds * (world * (world + 1) / 2) * direction
    return {
        "rank": rank,
        "world": world,
        "servers": len(sps.server_endpoints()),
        "before": before.tolist(),
        "after": after.tolist(),
        "expected": expected.tolist(),
        "ok": bool(np.allclose(after, expected, rtol=0, atol=1e-4)),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sps.init()
    if sps.is_server():
        sps.run_server()  # blocks until the launcher stops the job
        return 0
    result = train(args.rounds)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"worker.{result['rank']}.json").write_text(json.dumps(result))
    if result["ok"]:
        log.info(
            "worker %d of %d: all %d rows as expected", result["rank"], result["world"], len(KEYS)
        )
    else:
        log.error("worker %d: rows differ from the expected values: %s", result["rank"], result)
    sps.stop()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
