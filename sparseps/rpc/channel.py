"""A client's connection to all servers: one DEALER socket per server, one I/O thread.

A channel holds three parts: its connections (:class:`~.channel_links.ServerLinks`: one
DEALER per server, monitor events, handshakes, lost servers, reconnects, new servers), the
book of calls waiting for a reply (:class:`~.call.PendingCalls`, bounded by
``max_in_flight``) and the readers of replies (:class:`~.channel_receive.ReceivingByWaiters`).
Any thread may :meth:`Channel.submit` a request; the submitting thread sends it on its
server's DEALER itself (zero-copy), under the channel's socket lock. Replies are read by
the threads that wait for them (one reads, the others sleep until their reply is
delivered), matched to requests by id. The I/O thread serves the connections' events,
sends what zmq could not take yet, and sweeps the DEALERs once per poll round for replies
nobody waits for yet.

Why the callers do the socket work: handing each request to the I/O thread over an inproc
socket, and each reply back, cost two wake-ups of a Python thread and two GIL hand-offs
per request; on 2 cores the client's CPU per small pull fell by ~20% for each half
(bench/RESULTS.md, rpc).

A zmq socket is not thread-safe; the socket lock (``_io``, shared by the three parts)
serialises every use of a DEALER (send, receive, ``EVENTS``, close, reconnect). ``zmq.FD`` is edge-triggered: any
operation on the socket, a send included, may consume the notice that replies are
waiting, so whoever operates on a DEALER drains its replies (``EVENTS`` says ``POLLIN``)
before letting go of the lock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
import zmq

from ..core.closing import Closing
from ..errors import DeadlineError, ProtocolError, RemoteError, UnavailableError
from . import transport
from .call import Call, PendingCalls
from .channel_links import HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS, ServerLinks
from .channel_receive import ReceivingByWaiters
from .ops import OPS, UPDATE_OPS, OpSchema
from .protocol import Forward, Limits, Reply, encode_request
from .reply_slots import ATTACH_WAIT_S, DEFAULT_SLOT_BYTES, SlotOffers, worth_a_slot
from .security import Security

__all__ = ["HEARTBEAT_IVL_MS", "HEARTBEAT_TIMEOUT_MS", "Call", "Channel"]

log = logging.getLogger(__name__)

_POLL_MS = 50


def _client_of(call: Call, own: int) -> int:
    """The client id an update is sent under: its writer's when passed on, else ours."""
    return own if call.client is None else call.client


def _nudged(fd: int) -> bool:
    """Read one batch of nudges; False when none is left."""
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


class Channel(Closing):
    """Request/reply transport to a list of servers (used by :class:`PSClient`).

    Args:
        endpoints: ``host:port`` per server rank.
        timeout: default seconds a wait may take.
        timeout_setting: how the user changes ``timeout`` (named in timeout errors).
        max_in_flight: requests that may be outstanding at once (all servers together).
        limits: message size limits.
        security: CURVE keys of the job (None: plain transport). A server that refuses
            the handshake (wrong key, or one side without a key) fails that server's
            pending and new calls at once with an :class:`UnavailableError`.
        job_id: sent with every request; servers of another job refuse it.
        update_retries: times an update op (:data:`~sparseps.rpc.ops.UPDATE_OPS`) is sent
            again, with the same sequence number, when its server did not answer in time.
            The server applies each sequence number once, so a retry never doubles a push.
        detect_loss: a replicated job's client (``--replicas``): a server whose connection
            drops (its process exited, or zmq heartbeats went unanswered for
            :data:`HEARTBEAT_TIMEOUT_MS`) is *lost*: its pending and later calls fail at once
            with an :class:`UnavailableError` and its socket is closed, so nothing queued for
            it reaches a later process on the same port. :meth:`lost` tells which.
        role: what the peers are, in errors (``server``; ``heter_worker`` for heter workers).
        ops: the peers' op table; an ok reply must hold what its op's schema answers
            (:mod:`sparseps.rpc.answers`), else its call fails with a ProtocolError.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float,
        timeout_setting: str,
        max_in_flight: int,
        limits: Limits,
        security: Security | None = None,
        job_id: str | None = None,
        update_retries: int = 0,
        detect_loss: bool = False,
        role: str = "server",
        ops: Mapping[str, OpSchema] = OPS,
        reply_slots: int = 0,
        reply_slot_bytes: int = DEFAULT_SLOT_BYTES,
    ) -> None:
        self.role = role
        self.ops = ops
        self.job_id = job_id
        self.detect_loss = detect_loss
        self.update_retries = update_retries
        # Random per client: (client_id, seq) names one update across the servers' windows.
        self.client_id = secrets.randbits(63)
        self._seqs = itertools.count(1)
        self.timeout = timeout
        self.timeout_setting = timeout_setting
        self.limits = limits
        self.security = security
        self._ids = itertools.count(1)
        self._calls = PendingCalls(max_in_flight)
        self._closing = threading.Event()
        self._context = transport.new_context()
        # Every use of a DEALER (and of the lists of sockets) holds it; taken before the
        # book's and the readers' locks.
        self._io = threading.Lock()
        # written to wake the I/O thread from its poll (see nudge)
        self._nudge_r, self._nudge_w = os.pipe()
        os.set_blocking(self._nudge_r, False)
        os.set_blocking(self._nudge_w, False)
        # same-host servers write pull answers into our memory (reply_slots)
        self.replies = SlotOffers(
            self._attach_replies, slots=reply_slots, slot_bytes=reply_slot_bytes
        )
        self._links = ServerLinks(
            endpoints, role=role, limits=limits, security=security, detect_loss=detect_loss,
            context=self._context, io=self._io, calls=self._calls,
            fail=self._fail_unavailable, nudge=self.nudge,
        )  # fmt: skip
        self._receiving = ReceivingByWaiters(
            io=self._io, links=self._links, calls=self._calls, replies=self.replies,
            limits=limits, ops=ops, role=role,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._run, name="sparseps-client-io", daemon=True)
        self._thread.start()

    @property
    def endpoints(self) -> tuple[str, ...]:
        """``host:port`` per server rank (an elastic job's new servers appended: :meth:`grow`)."""
        return self._links.endpoints

    # -- caller side -------------------------------------------------------------------

    def submit(
        self,
        rank: int,
        op: str,
        table: str | None,
        bufs: Sequence[np.ndarray] = (),
        args: dict | None = None,
        *,
        shard: int | None = None,
        seq: int | None = None,
        epoch: int | None = None,
        client: int | None = None,
        forward: Forward | None = None,
    ) -> Call:
        """Queue one request to server ``rank``; returns its :class:`Call` at once.

        Args:
            shard: the shard it is for when ``rank`` holds it as a replica.
            seq: an update's sequence number from :meth:`next_seq` (the copies of one
                update share it); default: a fresh one.
            epoch: the sender's epoch of the shard (a replicated write).
            client: the update's client id when it is not this channel's (a write one
                copy of a shard passes on to the next keeps its writer's ``(client, seq)``).
            forward: a write passed on along a replicated shard's chain.
        """
        endpoints = self._links.endpoints
        if self._closing.is_set():
            raise UnavailableError(
                f"{op}: the PSClient is closed",
                op=op,
                role=self.role,
                rank=rank,
                address=endpoints[rank],
            )
        schema, slot = self.ops.get(op), None
        if schema is not None and schema.slot_reply and worth_a_slot(bufs):
            slot = self.replies.offer(rank, endpoints[rank])  # first: it may attach
        if not self._take_slot():
            self.replies.give_back(slot)
            raise DeadlineError(
                f"{op}: {self._calls.max_in_flight} requests still in flight after {self.timeout:.3g} s; the servers "
                "are not answering fast enough (raise PSClient(max_in_flight=...) or wait on handles)",
                op=op, role=self.role, rank=rank, address=endpoints[rank], seconds=self.timeout,
                setting="PSClient(max_in_flight=...)",
            )  # fmt: skip
        call = Call(next(self._ids), rank, op, table, shard=shard, epoch=epoch, slot=slot)
        call.client, call.forward = client, forward
        if client is not None:  # another client's update, passed on: its (client, seq)
            call.seq = seq
        elif op in UPDATE_OPS:
            call.seq = next(self._seqs) if seq is None else seq
            call.retries_left = self.update_retries
            if call.retries_left:
                call.resend = (tuple(bufs), args)
        self._send(call, bufs, args)
        return call

    def wait(self, call: Call, deadline: float, timeout: float) -> Reply:
        """The reply of ``call`` by ``deadline`` (monotonic), raising the right error."""
        while not self._receiving.await_reply(call, deadline):
            self.forget(call)
            if call.event.is_set():
                break
            if self._retry(call):
                deadline = time.monotonic() + timeout
                continue
            if not call.event.is_set():
                address = self.endpoints[call.rank]
                raise DeadlineError(
                    f"{call.op}{'' if call.table is None else f' {call.table!r}'}: {self.role} {call.rank} at "
                    f"{address} did not answer within {timeout:.3g} s (connection: {self._links.state(call.rank)}); "
                    f"the server may be dead, hung or overloaded. Change the limit with {self.timeout_setting}",
                    op=call.op, role=self.role, rank=call.rank, address=address, seconds=timeout,
                    setting=self.timeout_setting,
                )  # fmt: skip
        if call.failure is not None:
            raise call.failure
        reply = call.reply
        assert reply is not None, "a call is set with a reply or a failure"
        if not reply.ok:
            raise self._remote_error(call, reply.error or {})
        return reply

    def settled(self, call: Call, seconds: float) -> bool:
        """Whether ``call`` is answered within ``seconds`` (reading replies meanwhile)."""
        return self._receiving.await_reply(call, time.monotonic() + seconds)

    def waiting(self) -> int:
        """How many threads wait for replies now (one reads, the others follow it)."""
        return self._receiving.waiting()

    def forget(self, call: Call) -> None:
        """Stop waiting for ``call`` (its reply, if any arrives, is dropped)."""
        if self._calls.take(call.id) is not None and call.slot is not None:
            # the server may still write into its reply slot: not reused yet
            self.replies.orphan(call.id, call.slot)

    def collect(self) -> None:
        """Deliver the replies that already arrived, without waiting (skipped when another
        thread is using the sockets: it delivers them)."""
        self._receiving.collect()

    def next_seq(self) -> int:
        """A fresh update sequence number (for the copies of one replicated update)."""
        return next(self._seqs)

    # -- the connections (ServerLinks) ----------------------------------------------------

    def lost(self, rank: int) -> str | None:
        """Why server ``rank`` is lost (``detect_loss``), or None."""
        return self._links.lost(rank)

    def connected(self, rank: int) -> bool:
        """Whether the connection to server ``rank`` is up (as its monitor last said)."""
        return self._links.connected(rank)

    def refusing(self, rank: int) -> bool:
        """Whether server ``rank``'s port refused the last connection attempt."""
        return self._links.refusing(rank)

    def revive(self, rank: int, timeout: float = 10.0) -> None:
        """Connect again to a lost server ``rank`` (:meth:`ServerLinks.revive`)."""
        self._links.revive(rank, timeout)

    def mark_lost(self, rank: int, why: str, timeout: float = 10.0) -> None:
        """Treat server ``rank`` as lost, saying ``why`` (:meth:`ServerLinks.mark_lost`)."""
        self._links.mark_lost(rank, why, timeout)

    def grow(self, endpoints: Sequence[str], timeout: float = 10.0) -> list[int]:
        """The ranks of ``endpoints``, connecting to new ones (:meth:`ServerLinks.grow`)."""
        return self._links.grow(endpoints, timeout)

    def nudge(self) -> None:
        """Wake the I/O thread now (a close, a reconnect or new servers asked for)."""
        # a full pipe: the thread is awake already; -1: the channel is closed
        with contextlib.suppress(OSError):
            os.write(self._nudge_w, b"\0")

    def close(self, timeout: float = 2.0) -> None:
        """Stop the I/O thread and close every socket; pending calls fail as unavailable."""
        if self._closing.is_set():
            return
        self._closing.set()
        self.nudge()
        self._thread.join(timeout)
        with self._io:
            self._links.close_sockets()
        for call in self._calls.take_all():
            call.failure = UnavailableError(
                f"{call.op}: the PSClient was closed before {self.role} {call.rank} answered",
                op=call.op, role=self.role, rank=call.rank, address=self.endpoints[call.rank],
            )  # fmt: skip
            self._receiving.settle(call)
        self._context.term()
        os.close(self._nudge_r)
        os.close(self._nudge_w)
        self._nudge_r = self._nudge_w = -1  # the numbers may be reused by other files

    # -- internals ---------------------------------------------------------------------

    def _take_slot(self) -> bool:
        """An in-flight slot within the timeout. Replies free slots; nobody may be waiting
        for the ones that would free one, so this thread reads them meanwhile."""
        if self._calls.reserve():
            return True
        deadline = time.monotonic() + self.timeout
        while True:
            self.collect()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._calls.reserve(min(remaining, 0.002)):
                return True

    def _send(self, call: Call, bufs: Sequence[np.ndarray], args: dict | None) -> None:
        try:
            frames = encode_request(
                call.op, call.id, call.table, bufs, args, job=self.job_id,
                client=None if call.seq is None else _client_of(call, self.client_id),
                seq=call.seq, shard=call.shard, epoch=call.epoch, forward=call.forward,
                slot=None if call.slot is None else (call.slot[0].segment, call.slot[1]),
            )  # fmt: skip
        except BaseException:
            self._calls.unreserve()
            self.replies.give_back(call.slot)
            raise
        self._calls.add(call)
        links = self._links
        with self._io:
            if links.closed:
                links.fail_if_pending(call, "the PSClient is closed")
                return
            links.send(call, frames)
            if links.lost(call.rank) is None:
                self._receiving.drain(call.rank)

    def _attach_replies(self, rank: int, args: dict) -> dict:
        """Ask server ``rank`` for a segment of reply slots (its answer, checked, within
        :data:`~.reply_slots.ATTACH_WAIT_S`)."""
        call = self.submit(rank, "attach_replies", None, args=args)
        limit = min(self.timeout, ATTACH_WAIT_S)
        return dict(cast(dict, self.wait(call, time.monotonic() + limit, limit).result))

    def _retry(self, call: Call) -> bool:
        """Send a timed-out update again under a new request id (same seq); False when no
        retry is left or the slot for it cannot be had."""
        if not call.retries_left or call.resend is None or self._closing.is_set():
            return False
        if not self._take_slot():
            return False
        call.retries_left -= 1
        old_id, call.id = call.id, next(self._ids)
        log.warning(
            "%s %r: server %d at %s did not answer request %d in time; sending it again as "
            "request %d (seq %d, applied once by the server)",
            call.op, call.table, call.rank, self.endpoints[call.rank], old_id, call.id, call.seq,
        )  # fmt: skip
        bufs, args = call.resend
        self._send(call, bufs, args)
        return True

    def _fail_unavailable(self, call: Call, why: str | None) -> None:
        """Fail ``call`` (taken out of the book) as unavailable, saying ``why``."""
        call.failure = UnavailableError(
            f"{call.op}: {why}",
            op=call.op, role=self.role, rank=call.rank, address=self.endpoints[call.rank],
        )  # fmt: skip
        self._receiving.settle(call)

    def _remote_error(self, call: Call, error: dict) -> Exception:
        kind = str(error.get("type", "Error"))
        message = str(error.get("message", ""))
        where = f"{self.role} {call.rank} at {self.endpoints[call.rank]}"
        if kind == "ProtocolError":
            return ProtocolError(f"{call.op}: {where} rejected the request: {message}")
        return RemoteError(
            f"{call.op}{'' if call.table is None else f' {call.table!r}'}: {where} raised {kind}: {message}",
            remote_type=kind, remote_traceback=str(error.get("traceback", "")), role=self.role,
            rank=call.rank, address=self.endpoints[call.rank], op=call.op,
        )  # fmt: skip

    def _run(self) -> None:
        links = self._links
        poller = links.poller
        poller.register(self._nudge_r, zmq.POLLIN)
        with self._io:
            links.watch_all()
        try:
            while not self._closing.is_set():
                ready = poller.poll(_POLL_MS)
                if any(what == self._nudge_r for what, _ in ready):
                    while _nudged(self._nudge_r):
                        pass
                with self._io:
                    links.serve_requests()
                    for what, _ in ready:
                        links.on_ready(what)
                    # replies nobody waits for yet (see channel_receive)
                    self._receiving.drain_all()
                    links.flush_backlogs()
        except zmq.ContextTerminated:  # pragma: no cover - close() joins first
            pass
        except Exception:  # pragma: no cover - a bug here must not hang callers silently
            log.exception("sparseps client I/O thread failed; pending requests will time out")
