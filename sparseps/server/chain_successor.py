"""``Successor``: a copy of a replicated shard passes each write it applied to the next
copy of the shard's chain, and answers the write once that copy has acknowledged it.

The next copy acknowledges a write only once *its* next copy did, so an answer from the
head means the write is on every live copy of the chain (:mod:`sparseps.server.shard_chain`).
Writes are passed on in the order this copy applied them (the caller holds the chain's
order lock while it applies a write and hands it here), over one connection, so the
next copy receives them in that order; one thread per copy waits for the
acknowledgements, oldest first, and sends each answer through the loop
(:class:`~sparseps.server.relay.Relay`).

When the next copy is lost (its connection dropped) every write not yet acknowledged is
passed on again, in order, to the copy after it (or answered at once when this copy is
now the chain's tail). A copy that already has a write (by its index) acknowledges it
without applying it again, so passing on again never doubles a write.

A write answered from a duplicate (a client sending again a write this copy has) waits
behind every write before it, like any other: its answer means what the first one's
would have.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import DeadlineError, RemoteError, SparsePSError, UnavailableError
from ..rpc.channel import Call, Channel
from ..rpc.protocol import Forward, encode_reply
from .relay import Relay, Route

__all__ = ["Entry", "Successor"]

log = logging.getLogger(__name__)

# How long one wait for the next copy's acknowledgement lasts before the write is passed
# on again (a slow copy, e.g. busy loading a table, is not a lost one).
ACK_WAIT_S = 60.0


@dataclass(frozen=True)
class Entry:
    """One write as it is passed on: what the next copy applies, and where in the order."""

    op: str
    table: str | None
    bufs: tuple[np.ndarray, ...]
    args: dict
    client: int | None
    seq: int | None
    index: int


@dataclass(eq=False)
class _Pending:
    """A write (or a duplicate's answer) waiting for the next copy's acknowledgement."""

    entry: Entry | None  # None: a duplicate's answer, which only waits its turn
    answer: tuple[object, list]
    route: Route | None
    call: Call | None = None
    failure: SparsePSError | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Successor:
    """The passing on of one copy's writes to the next copy of its chain.

    Args:
        shard: the shard (for the requests and log lines).
        holder: this server's rank.
        peers: the server's channel to the other servers (loss detection on).
        relay: where answers leave through the loop.
        next_copy: ``() -> (rank, epoch, members)`` of the next live copy, or None when
            this copy is the chain's tail (called holding the chain's order lock).
        order: the chain's order lock.
    """

    def __init__(
        self,
        shard: int,
        holder: int,
        peers: Channel,
        relay: Relay | None,
        *,
        next_copy: Callable[[], tuple[int, int, tuple[int, ...]] | None],
        order: threading.RLock,
    ) -> None:
        self.shard = shard
        self.holder = holder
        self.peers = peers
        self.relay = relay
        self.next_copy = next_copy
        self.order = order
        self._fifo: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    # -- called holding the order lock -------------------------------------------------

    def pass_on(self, entry: Entry, answer: tuple[object, list], route: Route | None):
        """Send ``entry`` to the next copy; answer ``route`` once it is acknowledged.

        Returns ``answer`` when it can be given at once (this copy is the tail and nothing
        waits before it), else None: the answer leaves later through the relay (or, with
        no route, this call waits for it).
        """
        target = self.next_copy()
        if target is None and not self._waiting():
            return answer
        pending = _Pending(entry, answer, route)
        if target is not None:
            pending.call = self._send(target, entry)
        return self._enqueue(pending)

    def after_earlier(self, answer: tuple[object, list], route: Route | None):
        """Answer ``route`` with ``answer`` once every write before it is acknowledged."""
        if not self._waiting():
            return answer
        return self._enqueue(_Pending(None, answer, route))

    def drained(self, timeout: float) -> bool:
        """Wait until every write passed on is acknowledged (a replacement's copy is
        saved after this); False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._fifo:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    # -- internals ---------------------------------------------------------------------

    def _waiting(self) -> bool:
        with self._cond:
            return bool(self._fifo)

    def _enqueue(self, pending: _Pending):
        with self._cond:
            self._fifo.append(pending)
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._acknowledge, daemon=True,
                    name=f"sparseps-server-{self.holder}-chain-{self.shard}",
                )  # fmt: skip
                self._thread.start()
        if pending.route is not None:
            return None
        pending.done.wait()  # an in-process caller (no route): the answer is returned
        if pending.failure is not None:
            raise pending.failure
        return pending.answer

    def _send(self, target: tuple[int, int, tuple[int, ...]], entry: Entry) -> Call:
        rank, epoch, members = target
        return self.peers.submit(
            rank, entry.op, entry.table, entry.bufs, entry.args,
            shard=None if rank == self.shard else self.shard, seq=entry.seq, epoch=epoch,
            client=entry.client, forward=Forward(entry.index, members),
        )  # fmt: skip

    def _acknowledge(self) -> None:
        """The thread: wait for the oldest write's acknowledgement, answer it, repeat."""
        while True:
            with self._cond:
                while not self._fifo and not self._stopped:
                    self._cond.wait(1.0)
                if self._stopped:
                    return
                pending = self._fifo[0]
            if pending.call is not None and not self._acknowledged(pending):
                continue
            with self._cond:
                self._fifo.popleft()
                self._cond.notify_all()
            self._answer(pending)

    def _acknowledged(self, pending: _Pending) -> bool:
        """Wait for ``pending``'s acknowledgement: True when it came (or the write failed
        for good), False when everything waiting was passed on again."""
        call = pending.call
        assert call is not None
        index = pending.entry.index if pending.entry is not None else -1
        try:
            self.peers.wait(call, time.monotonic() + ACK_WAIT_S, ACK_WAIT_S)
            return True
        except UnavailableError as exc:
            if self.peers.lost(call.rank) is None:  # not lost: refused us (keys), or closing
                log.warning("server %d, shard %d: %s", self.holder, self.shard, exc)
                time.sleep(0.1)
            else:
                log.warning(
                    "server %d, shard %d: the next copy (server %d) is lost; passing on again "
                    "the writes it did not acknowledge", self.holder, self.shard, call.rank,
                )  # fmt: skip
        except DeadlineError:
            log.warning(
                "server %d, shard %d: server %d did not acknowledge write %d in %.0f s; "
                "passing it on again", self.holder, self.shard, call.rank, index, ACK_WAIT_S,
            )  # fmt: skip
        except SparsePSError as exc:
            if not (isinstance(exc, RemoteError) and exc.remote_type == "ChainGapError"):
                # the next copy refused a write this copy applied: the copies differ
                log.error(
                    "server %d, shard %d: server %d refused write %d that this copy applied: "
                    "%s", self.holder, self.shard, call.rank, index, exc,
                )  # fmt: skip
                pending.failure = exc
                return True
        self._pass_on_again()
        return False

    def _pass_on_again(self) -> None:
        """Send every write not yet acknowledged again, in order, to the next live copy."""
        with self.order:
            target = self.next_copy()
            with self._cond:
                waiting = list(self._fifo)
            for pending in waiting:
                if pending.call is not None:
                    self.peers.forget(pending.call)
                    pending.call = None
                if pending.entry is not None and target is not None:
                    pending.call = self._send(target, pending.entry)

    def _answer(self, pending: _Pending) -> None:
        if pending.route is None:
            pending.done.set()
            return
        if self.relay is None:
            return
        route = pending.route
        if pending.failure is not None:
            failure = pending.failure
            kind = failure.remote_type if isinstance(failure, RemoteError) else None
            error = {"type": kind or type(failure).__name__, "message": str(failure),
                     "traceback": ""}  # fmt: skip
            frames = encode_reply(route.request_id, error=error)
        else:
            result, bufs = pending.answer
            frames = encode_reply(route.request_id, result=result, bufs=bufs)
        self.relay.send(route.identity, frames)
