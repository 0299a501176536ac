"""A replacement server copies its shards from the survivors (``--replicas``).

The launcher starts a lost server's replacement on the same rank and port with
``SPARSEPS_RECOVER=1``. Its copies start *recovering* (they refuse clients), and this
module fills each from the shard's head, while training goes on against the survivors
(see :mod:`sparseps.server.shard_chain` for the head's side):

``shard_info`` (which copy is the head) -> ``replicate`` (the head pauses the shard's
writes, waits until every write it passed on is acknowledged, and saves the shard into a
folder both servers see) -> load the files, adopt the applied updates -> ``replicate_done``
(the head puts this copy at the end of the shard's chain, in a new epoch, and resumes) ->
this copy serves, and receives every later write down the chain.

A head that is busy (another replacement copying), or that changed (the old one was lost
and the next copy took over), is asked again until :data:`RECOVER_TIMEOUT_S`. A shard
whose every surviving copy fails to answer, or answers what a copy cannot use, leaves
the replacement unable to serve it: that is an error naming each server tried, and the
server exits non-zero (the launcher then reports the job's data as lost, naming the
servers).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

from ..core.replicas import chain
from ..errors import DeadlineError, ProtocolError, RemoteError, SparsePSError, UnavailableError
from ..rpc.channel import Channel
from ..rpc.protocol import Request
from .handlers import ServerState

__all__ = ["RECOVER_TIMEOUT_S", "recover"]

log = logging.getLogger(__name__)

# A survivor's pause and save of one shard (large tables take a while to write), and the
# longest a replacement keeps asking a busy or changing head.
RECOVER_TIMEOUT_S = 600.0
_RETRY_S = 0.1
# How long a copy may take to say which copy is the head.
_ASK_S = 5.0
# Refusals of a head that is busy or no longer the head: ask again.
_AGAIN = frozenset({"ShardBusyError", "NotHeadError", "StaleEpochError", "RecoveringError"})


def _call(
    channel: Channel, rank: int, op: str, shard: int, args: dict, timeout: float = RECOVER_TIMEOUT_S
) -> dict:
    """A survivor's answer. The channel holds it to the op's schema (a peer's reply is
    remote input): a malformed one, e.g. from a server of another sparseps version, is a
    ProtocolError, and that survivor is not asked again."""
    call = channel.submit(rank, op, None, (), args, shard=None if rank == shard else shard)
    try:
        reply = channel.wait(call, time.monotonic() + timeout, timeout)
    except BaseException:
        channel.forget(call)
        raise
    return reply.result  # type: ignore[return-value]


def _load(copy: ServerState, info: dict) -> int:
    """Install a ``replicate`` answer into ``copy`` (still refusing clients); rows loaded."""
    rows = 0

    def run(op: str, table: str, args: dict) -> dict:
        request = Request(op=op, id=0, table=table, bufs={}, args=args)
        result = copy.ops[op].handler(request)[0]
        return result if isinstance(result, dict) else {}

    for name, table in info["tables"].items():
        run("create_table", name, {"config": table["config"]})
        rows += run("load", name, {"files": table["files"]})["rows"]
    for name, dense in info["dense"].items():
        run("create_dense", name, dense["spec"])
        run("load_dense", name, {"path": dense["file"]["path"], "sha256": dense["file"]["sha256"]})
    copy.applied.adopt(info["applied"])
    return rows


def recover(
    state: ServerState,
    channel: Channel,
    *,
    directory: str | None = None,
    timeout: float = RECOVER_TIMEOUT_S,
) -> None:
    """Copy every shard ``state`` holds (its own and its backups) from the shard's head.

    Args:
        state: the replacement's state, every copy still recovering.
        channel: the server's channel to the other servers (loss detection on).
        directory: a folder the survivors can write and this server read (default: a
            fresh temporary folder, which works on one host; across hosts a shared one,
            as for checkpoints); emptied afterwards.
        timeout: how long a shard's copy may take, retries included.

    Raises:
        UnavailableError: no surviving copy of some shard could be copied.
    """
    folder = tempfile.mkdtemp(prefix=f"sparseps-recover-{state.rank}-", dir=directory)
    try:
        for copy in [state, *state.backups.values()]:
            _copy_shard(state, copy, channel, os.path.join(folder, f"shard-{copy.rank}"), timeout)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy_shard(
    state: ServerState, copy: ServerState, channel: Channel, where: str, timeout: float
) -> None:
    shard = copy.rank
    others = [r for r in chain(shard, state.num_servers, state.replicas) if r != state.rank]
    failed: dict[int, str] = {}  # servers whose answers a copy cannot use
    deadline = time.monotonic() + timeout
    last = "no other copy"
    while True:
        candidates = [r for r in others if r not in failed and channel.lost(r) is None]
        head = _head(channel, shard, candidates) if candidates else None
        if head is None and not candidates:
            reasons = [f"server {r}: {why}" for r, why in failed.items()]
            reasons += [f"server {r}: {channel.lost(r)}" for r in others if r not in failed]
            raise UnavailableError(
                f"server {state.rank}: no surviving copy of shard {shard} could be copied "
                f"({'; '.join(reasons) or last}); its data is lost",
                op="replicate", role="server", rank=state.rank,
                address=channel.endpoints[state.rank],
            )  # fmt: skip
        if time.monotonic() > deadline:
            raise UnavailableError(
                f"server {state.rank}: shard {shard} could not be copied within {timeout:g} s "
                f"(last: {last})", op="replicate", role="server", rank=state.rank,
                address=channel.endpoints[state.rank],
            )  # fmt: skip
        if head is None:
            time.sleep(_RETRY_S)
            continue
        started = time.perf_counter()
        try:
            info = _call(
                channel, head, "replicate", shard, {"directory": where, "rank": state.rank}
            )
            rows = _load(copy, info)
            done = _call(channel, head, "replicate_done", shard,
                         {"rank": state.rank, "epoch": info["epoch"]})  # fmt: skip
        except SparsePSError as exc:
            last = f"server {head}: {exc}"
            if isinstance(exc, RemoteError) and exc.remote_type in _AGAIN:
                time.sleep(_RETRY_S)
            elif not isinstance(exc, UnavailableError):  # malformed, or a real failure
                failed[head] = str(exc)
                log.warning(
                    "server %d: copying shard %d from server %d failed: %s",
                    state.rank, shard, head, exc,
                )  # fmt: skip
            continue
        copy.chain.join(int(info["index"]), done)
        log.info(
            "server %d: re-replicated shard %d from server %d: %d rows, %d table(s), "
            "%d dense table(s) in %.2f s; epoch %d, copies on servers %s",
            state.rank, shard, head, rows, len(info["tables"]), len(info["dense"]),
            time.perf_counter() - started, copy.chain.epoch, list(copy.chain.members),
        )  # fmt: skip
        return


def _head(channel: Channel, shard: int, ranks: list[int]) -> int | None:
    """The head of ``shard`` as the newest view among ``ranks`` names it: its first copy
    that is not this server's and not lost (None: no usable answer yet)."""
    views = []
    for rank in ranks:
        try:
            info = _call(channel, rank, "shard_info", shard, {}, timeout=_ASK_S)
        except DeadlineError:  # never connected: a dead server nobody replaced yet
            channel.mark_lost(rank, f"it did not answer shard_info within {_ASK_S:g} s")
            continue
        except (UnavailableError, ProtocolError, RemoteError):
            continue
        if not info["recovering"]:
            views.append((int(info["epoch"]), [int(m) for m in info["members"]]))
    if not views:
        return None
    _, members = max(views)
    for rank in members:
        if rank in ranks and channel.lost(rank) is None:
            return rank
    return None
