"""How a :class:`~sparseps.rpc.channel.Channel` reads replies: the waiting threads do it.

A thread that waits for a reply reads the DEALER sockets itself instead of sleeping until
another thread hands the reply over. Only one thread reads at a time (the *leader*): it
polls every DEALER's notification descriptor (``zmq.FD``), drains the sockets that have
news under the socket lock and delivers every reply it finds, its own and the other
waiters'. The other waiting threads (*followers*) sleep on a wake event of their own
(one per thread, reused), set when their reply is delivered or when the leader steps
down and hands the reading over to one of them.

Why: when the channel's I/O thread read the replies, every reply woke two threads (the
I/O thread, then the waiter) and moved the GIL twice; a pipelined pull cost the client
~25% more CPU that way (bench/RESULTS.md, rpc). The I/O thread still sweeps every DEALER
once per poll round (``_POLL_MS``), so a reply nobody waits for yet (a push whose handle
is waited on later) is delivered within that round and frees its in-flight slot;
:meth:`collect` reads at once without waiting (``Handle.done``).

Delivering a reply (:meth:`ReceivingByWaiters._deliver`) matches it to its call (taking
it out of the book of waiting calls frees its in-flight slot), frees its reply slot unless
the answer is in it (:mod:`.reply_slots`), holds the answer to its op's schema
(:mod:`.answers`) and wakes the call's waiter.

The channel holds one :class:`ReceivingByWaiters` beside its connections
(:class:`~sparseps.rpc.channel_links.ServerLinks`, whose DEALERs it reads) and the book of
waiting calls (:class:`~sparseps.rpc.call.PendingCalls`).
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import zmq

from ..errors import ProtocolError
from . import transport
from .answers import check_answer
from .protocol import decode_reply, peek_request_id

if TYPE_CHECKING:
    from .call import Call, PendingCalls
    from .channel_links import ServerLinks
    from .ops import OpSchema
    from .protocol import Limits
    from .reply_slots import SlotOffers

__all__ = ["ReceivingByWaiters"]

log = logging.getLogger("sparseps.rpc.channel")

# A leader wakes at least this often (seconds) to re-read the sockets it polls.
_LEAD_POLL_S = 0.05
# pyzmq's enum constants as ints: combining enums costs more than the option call
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class ReceivingByWaiters:
    """How the waiting threads read and deliver the replies of a channel's calls.

    Args:
        io: the socket lock (every use of a DEALER holds it).
        links: the connections, whose DEALERs are read.
        calls: the waiting calls, matched to replies by id.
        replies: the reply slots offered with calls (an answer may be in one).
        limits: message size limits (replies are decoded against them).
        ops: the peers' op table (an ok reply is held to its op's answer).
        role: what the peers are, in messages.

    Lock order: the socket lock before this object's own lock (the leader and the
    followers) and the book's.
    """

    def __init__(self, *, io: threading.Lock, links: ServerLinks, calls: PendingCalls,
                 replies: SlotOffers, limits: Limits, ops: Mapping[str, OpSchema],
                 role: str) -> None:  # fmt: skip
        self._io, self._links, self._calls = io, links, calls
        self._replies, self._limits, self._ops, self._role = replies, limits, ops, role
        self._lock = threading.Lock()
        self._leading = False  # a waiter is reading the DEALERs (under _lock)
        # a waiting thread's wake -> the call it waits for (two threads may wait for one)
        self._followers: dict[threading.Event, Call] = {}
        self._wakes = threading.local()

    def settle(self, call: Call) -> None:
        """Mark ``call`` answered (its reply or failure is set) and wake its waiter."""
        call.event.set()
        with self._lock:
            for wake, waiting in self._followers.items():
                if waiting is call:
                    wake.set()

    def waiting(self) -> int:
        """How many threads wait for replies now (the reader and its followers): the
        event a caller can wait on to know its threads are inside ``await_reply``."""
        with self._lock:
            return int(self._leading) + len(self._followers)

    def await_reply(self, call: Call, deadline: float) -> bool:
        """Wait until ``call`` is answered (True) or ``deadline`` (monotonic) passed (False),
        reading the sockets when no other waiting thread does."""
        wake = self._wake_event()
        while True:
            with self._lock:
                if call.event.is_set():
                    self._hand_over()
                    return True
                lead = not self._leading
                if lead:
                    self._leading = True
                else:
                    wake.clear()
                    self._followers[wake] = call
            if lead:
                try:
                    return self._lead(call, deadline)
                finally:
                    with self._lock:
                        self._leading = False
                        self._hand_over()
            remaining = deadline - time.monotonic()
            if remaining > 0:
                wake.wait(remaining)
            with self._lock:
                self._followers.pop(wake, None)
                if time.monotonic() >= deadline and not call.event.is_set():
                    self._hand_over()
                    return False

    def collect(self) -> None:
        """Deliver the replies that already arrived, without waiting (skipped when another
        thread is using the sockets: it delivers them)."""
        if not self._io.acquire(blocking=False):
            return
        try:
            if not self._links.closed:
                self.drain_all()
        finally:
            self._io.release()

    def drain_all(self) -> None:
        """Deliver every reply waiting on a live server's DEALER (socket lock held)."""
        links = self._links
        for rank in range(len(links.dealers)):
            if links.lost(rank) is None:
                self.drain(rank)

    def drain(self, rank: int) -> None:
        """Deliver every reply waiting on server ``rank``'s DEALER (socket lock held)."""
        sock = self._links.dealers[rank]
        while cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
            try:
                frames = transport.recv_frames(sock, block=False)
            except zmq.Again:  # pragma: no cover - EVENTS said a message was there
                return
            self._deliver(rank, frames)

    # -- internals -------------------------------------------------------------------

    def _wake_event(self) -> threading.Event:
        wake = getattr(self._wakes, "event", None)
        if wake is None:
            wake = self._wakes.event = threading.Event()
        return wake

    def _hand_over(self) -> None:
        """Nobody reads and someone waits: wake one follower to lead (holding ``_lock``)."""
        if not self._leading and self._followers:
            next(iter(self._followers)).set()

    def _lead(self, call: Call, deadline: float) -> bool:
        """Read every DEALER until ``call`` is answered or ``deadline``."""
        links = self._links
        poller = select.poll()
        polled: dict[int, int] = {}
        version = -1
        fired: set[int] | None = None  # None: drain every socket
        while True:
            with self._io:
                if links.closed:
                    return call.event.is_set()
                if version != links.version:  # a server was added, lost or revived
                    for fd in polled:
                        poller.unregister(fd)
                    polled = dict(links.descriptors)
                    for fd in polled:
                        poller.register(fd, select.POLLIN)
                    version, fired = links.version, None
                if fired is None:
                    self.drain_all()
                else:
                    for rank in fired:
                        if links.lost(rank) is None:
                            self.drain(rank)
            if call.event.is_set():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready = poller.poll(min(remaining, _LEAD_POLL_S) * 1000)
            fired = {polled[fd] for fd, _ in ready if fd in polled} if ready else None

    def _deliver(self, rank: int, frames: list) -> None:
        try:
            reply = decode_reply(frames, self._limits)
        except ProtocolError as exc:
            call = self._calls.take(peek_request_id(frames))
            if call is None:
                log.warning("dropped a malformed reply from server %d: %s", rank, exc)
                return
            self._replies.give_back(call.slot)
            self._fail_malformed(call, rank, exc)
            return
        call = self._calls.take(reply.id)
        if call is None:
            self._replies.late_reply(reply.id)
            log.debug(
                "dropped a late reply from server %d (request %s gave up waiting)", rank, reply.id
            )
            return
        try:
            reply = self._replies.receive(call.slot, reply, self._links.endpoints[rank])
            check_answer(reply, self._ops.get(call.op))
        except ProtocolError as exc:
            self._fail_malformed(call, rank, exc)
            return
        call.reply = reply
        self.settle(call)

    def _fail_malformed(self, call: Call, rank: int, exc: ProtocolError) -> None:
        call.failure = ProtocolError(
            f"{call.op}: malformed reply from {self._role} {rank} at "
            f"{self._links.endpoints[rank]}: {exc}"
        )
        self.settle(call)
