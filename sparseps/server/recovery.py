"""A replacement server copies its shards from the survivors (``--replicas``).

The launcher starts a lost server's replacement on the same rank and port with
``SPARSEPS_RECOVER=1``. Its copies start *recovering* (they refuse clients), and this
module fills each from a surviving copy of that shard, while training goes on against
the survivors (see :mod:`sparseps.server.replica_ops` for the survivor's side):

``replicate`` (the survivor pauses the shard's writes and saves it into a folder both
servers see) -> load the files, adopt the applied updates -> ``replicate_done`` (the
survivor moves to the next epoch with this copy in it and resumes) -> this copy serves.

A shard whose every surviving copy fails to answer leaves the replacement unable to
serve it: that is an error naming each server tried, and the server exits non-zero (the
launcher then reports the job's data as lost, naming the servers).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence

from ..core.replicas import chain
from ..errors import SparsePSError, UnavailableError
from ..rpc.channel import Channel
from ..rpc.handle import Handle
from ..rpc.protocol import Limits, Request
from ..rpc.security import Security
from .handlers import ServerState

__all__ = ["RECOVER_TIMEOUT_S", "recover"]

log = logging.getLogger(__name__)

# A survivor's pause and save of one shard (large tables take a while to write).
RECOVER_TIMEOUT_S = 600.0


def _call(channel: Channel, rank: int, op: str, shard: int, args: dict) -> dict:
    """A survivor's answer. The channel holds it to the op's schema (a peer's reply is
    remote input): a malformed one, e.g. from a server of another sparseps version, is a
    ProtocolError, and the next survivor is tried."""
    call = channel.submit(rank, op, None, (), args, shard=None if rank == shard else shard)
    return Handle(channel, [call], lambda replies: replies[0].result).wait(RECOVER_TIMEOUT_S)


def _load(copy: ServerState, info: dict) -> int:
    """Install a ``replicate`` answer into ``copy`` (still refusing clients); rows loaded."""
    rows = 0

    def run(op: str, table: str, args: dict) -> dict:
        request = Request(op=op, id=0, table=table, bufs={}, args=args)
        result = copy._ops[op](request)[0]
        return result if isinstance(result, dict) else {}

    for name, table in info["tables"].items():
        run("create_table", name, {"config": table["config"]})
        rows += run("load", name, {"files": table["files"]})["rows"]
    for name, dense in info["dense"].items():
        run("create_dense", name, dense["spec"])
        run("load_dense", name, {"path": dense["file"]["path"], "sha256": dense["file"]["sha256"]})
    copy._applied.adopt(info["applied"])
    return rows


def recover(
    state: ServerState,
    endpoints: Sequence[str],
    *,
    limits: Limits,
    security: Security | None = None,
    job_id: str | None = None,
    directory: str | None = None,
) -> None:
    """Copy every shard ``state`` holds (its own and its backups) from a survivor.

    Args:
        state: the replacement's state, every copy still recovering.
        endpoints: the job's servers.
        directory: a folder the survivors can write and this server read (default: a
            fresh temporary folder, which works on one host; across hosts a shared one,
            as for checkpoints); emptied afterwards.

    Raises:
        UnavailableError: no surviving copy of some shard answered.
    """
    channel = Channel(
        endpoints, timeout=RECOVER_TIMEOUT_S, timeout_setting="the recovery timeout",
        max_in_flight=4, limits=limits, security=security, job_id=job_id, detect_loss=True,
    )  # fmt: skip
    folder = tempfile.mkdtemp(prefix=f"sparseps-recover-{state.rank}-", dir=directory)
    try:
        for copy in [state, *state.backups.values()]:
            shard = copy.rank
            sources = [
                r for r in chain(shard, state.num_servers, state.replicas) if r != state.rank
            ]
            tried = []
            for source in sources:
                started = time.perf_counter()
                where = os.path.join(folder, f"shard-{shard}")
                try:
                    info = _call(
                        channel,
                        source,
                        "replicate",
                        shard,
                        {"directory": where, "rank": state.rank},
                    )
                    rows = _load(copy, info)
                    _call(
                        channel,
                        source,
                        "replicate_done",
                        shard,
                        {"rank": state.rank, "epoch": info["epoch"]},
                    )
                except SparsePSError as exc:
                    tried.append(f"server {source}: {exc}")
                    log.warning(
                        "server %d: copying shard %d from server %d failed: %s",
                        state.rank,
                        shard,
                        source,
                        exc,
                    )
                    continue
                copy.join(info, source)
                log.info(
                    "server %d: re-replicated shard %d from server %d: %d rows, %d table(s), "
                    "%d dense table(s) in %.2f s; epoch %d",
                    state.rank, shard, source, rows, len(info["tables"]), len(info["dense"]),
                    time.perf_counter() - started, copy.epoch,
                )  # fmt: skip
                break
            else:
                raise UnavailableError(
                    f"server {state.rank}: no surviving copy of shard {shard} could be copied "
                    f"({'; '.join(tried) or 'no other copy'}); its data is lost",
                    op="replicate", role="server", rank=state.rank, address=endpoints[state.rank],
                )  # fmt: skip
    finally:
        channel.close()
        shutil.rmtree(folder, ignore_errors=True)
