"""A client's connection to all servers: one DEALER socket per server, one I/O thread.

Any thread may :meth:`Channel.submit` a request; the submitting thread sends it on its
server's DEALER itself (zero-copy), under the channel's socket lock. Replies are read by
the threads that wait for them (:mod:`.channel_receive`: one reads, the others sleep
until their reply is delivered), matched to requests by id. The I/O thread watches the
connections (:mod:`.channel_links`: monitor events, handshakes, lost servers, reconnects,
new servers), sends what zmq could not take yet, and sweeps the DEALERs once per poll
round for replies nobody waits for yet. Many requests can be in flight at once, bounded by
``max_in_flight``.

Why the callers do the socket work: handing each request to the I/O thread over an inproc
socket, and each reply back, cost two wake-ups of a Python thread and two GIL hand-offs
per request; on 2 cores the client's CPU per small pull fell by ~20% for each half
(bench/RESULTS.md, rpc).

A zmq socket is not thread-safe; the socket lock (``_io``) serialises every use of a
DEALER (send, receive, ``EVENTS``, close, reconnect). ``zmq.FD`` is edge-triggered: any
operation on the socket, a send included, may consume the notice that replies are
waiting, so whoever operates on a DEALER drains its replies (``EVENTS`` says ``POLLIN``)
before letting go of the lock.
"""

from __future__ import annotations

import collections
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
from zmq.utils.monitor import recv_monitor_message

from ..core.closing import Closing
from ..errors import DeadlineError, ProtocolError, RemoteError, UnavailableError
from . import transport
from .call import Call
from .channel_links import HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS, ServerLinks
from .channel_receive import ReceivingByWaiters
from .ops import OPS, UPDATE_OPS, OpSchema
from .protocol import Forward, Limits, Reply, encode_request, peek_request_id
from .reply_slots import DEFAULT_SLOT_BYTES, SlotOffers, worth_a_slot
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


class Channel(ServerLinks, ReceivingByWaiters, Closing):
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
        self.endpoints = tuple(endpoints)
        self.role = role
        self.ops = ops
        self.job_id = job_id
        self.detect_loss = detect_loss
        # rank -> why it is lost (None: not lost); written by the I/O thread (socket lock)
        self._lost: list[str | None] = [None] * len(self.endpoints)
        self._was_connected = [False] * len(self.endpoints)
        self._why_lost: list[str] = [""] * len(self.endpoints)
        # the I/O thread's poller (monitor sockets); the DEALER descriptors (zmq.FD) and
        # their ranks, for the thread that reads replies (channel_receive)
        self._poller = zmq.Poller()
        self._rank_of: dict[int, int] = {}  # descriptor -> rank
        self._monitor_of: dict[zmq.Socket, int] = {}
        self.update_retries = update_retries
        # Random per client: (client_id, seq) names one update across the servers' windows.
        self.client_id = secrets.randbits(63)
        self._seqs = itertools.count(1)
        self.timeout = timeout
        self.timeout_setting = timeout_setting
        self.limits = limits
        self._ids = itertools.count(1)
        self._pending: dict[int, Call] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._state = ["connecting"] * len(self.endpoints)
        self._closing = threading.Event()
        self._context = transport.new_context()
        # Every use of a DEALER (and of the lists of sockets) holds it; taken before _lock.
        self._io = threading.Lock()
        self._sockets_closed = False
        # written to wake the I/O thread from its poll (see nudge)
        self._nudge_r, self._nudge_w = os.pipe()
        os.set_blocking(self._nudge_r, False)
        os.set_blocking(self._nudge_w, False)
        self._init_receiving()
        # same-host servers write pull answers into our memory (reply_slots)
        self.replies = SlotOffers(
            self._attach_replies, slots=reply_slots, slot_bytes=reply_slot_bytes
        )
        self.security = security
        # rank -> why its server refused our handshake (None: not refused); set and
        # cleared by the I/O thread from monitor events, read by senders in _forward
        # (both under the socket lock, as _lost and the backlogs are).
        self._refused: list[str | None] = [None] * len(self.endpoints)
        # rank -> requests zmq could not take yet (no usable connection: still connecting,
        # or torn down by a failed handshake whose monitor event has not arrived yet).
        # The I/O thread sends them when it can, fails them when the server refuses us,
        # and drops those whose callers gave up (their wait is bounded by the timeout).
        self._backlog: list[collections.deque] = [collections.deque() for _ in self.endpoints]
        self._dealers: list[zmq.Socket] = []
        self._monitors: list[zmq.Socket] = []
        for rank in range(len(self.endpoints)):
            dealer, monitor = self._connect(rank)
            self._dealers.append(dealer)
            self._monitors.append(monitor)
        # ranks a caller asked to reconnect (revive), served by the I/O thread
        self._revive: collections.deque[tuple[int, threading.Event]] = collections.deque()
        # endpoints a caller asked to add (an elastic job's new servers: grow)
        self._growth: collections.deque[tuple[list[str], threading.Event]] = collections.deque()
        self._grow_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sparseps-client-io", daemon=True)
        self._thread.start()

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
        if self._closing.is_set():
            raise UnavailableError(
                f"{op}: the PSClient is closed",
                op=op,
                role=self.role,
                rank=rank,
                address=self.endpoints[rank],
            )
        schema, slot = self.ops.get(op), None
        if schema is not None and schema.slot_reply and worth_a_slot(bufs):
            slot = self.replies.offer(rank, self.endpoints[rank])  # first: it may attach
        if not self._take_slot():
            self.replies.give_back(slot)
            raise DeadlineError(
                f"{op}: {self._max_in_flight} requests still in flight after {self.timeout:.3g} s; the servers "
                "are not answering fast enough (raise PSClient(max_in_flight=...) or wait on handles)",
                op=op, role=self.role, rank=rank, address=self.endpoints[rank], seconds=self.timeout,
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

    def _take_slot(self) -> bool:
        """An in-flight slot within the timeout. Replies free slots; nobody may be waiting
        for the ones that would free one, so this thread reads them meanwhile."""
        if self._slots.acquire(blocking=False):
            return True
        deadline = time.monotonic() + self.timeout
        while True:
            self.collect()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._slots.acquire(timeout=min(remaining, 0.002)):
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
            self._slots.release()
            self.replies.give_back(call.slot)
            raise
        with self._lock:
            self._pending[call.id] = call
        with self._io:
            if self._sockets_closed:
                self._fail_if_pending(call, "the PSClient is closed")
                return
            self._forward(call, frames)
            if self._lost[call.rank] is None:
                self._drain(call.rank)

    def _attach_replies(self, rank: int, args: dict) -> dict:
        """Ask server ``rank`` for a segment of reply slots (its answer, checked)."""
        call = self.submit(rank, "attach_replies", None, args=args)
        return dict(
            cast(dict, self.wait(call, time.monotonic() + self.timeout, self.timeout).result)
        )

    def next_seq(self) -> int:
        """A fresh update sequence number (for the copies of one replicated update)."""
        return next(self._seqs)

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

    def wait(self, call: Call, deadline: float, timeout: float) -> Reply:
        """The reply of ``call`` by ``deadline`` (monotonic), raising the right error."""
        while not self._await(call, deadline):
            self._forget(call)
            if call.event.is_set():
                break
            if self._retry(call):
                deadline = time.monotonic() + timeout
                continue
            if not call.event.is_set():
                address = self.endpoints[call.rank]
                raise DeadlineError(
                    f"{call.op}{'' if call.table is None else f' {call.table!r}'}: {self.role} {call.rank} at "
                    f"{address} did not answer within {timeout:.3g} s (connection: {self._state[call.rank]}); "
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
        return self._await(call, time.monotonic() + seconds)

    def forget(self, call: Call) -> None:
        """Stop waiting for ``call`` (its reply, if any arrives, is dropped)."""
        self._forget(call)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the I/O thread and close every socket; pending calls fail as unavailable."""
        if self._closing.is_set():
            return
        self._closing.set()
        self.nudge()
        self._thread.join(timeout)
        with self._io:
            self._sockets_closed = True
            for sock in [*self._monitors, *self._dealers]:
                sock.close(linger=0)
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for call in pending:
            call.failure = UnavailableError(
                f"{call.op}: the PSClient was closed before {self.role} {call.rank} answered",
                op=call.op, role=self.role, rank=call.rank, address=self.endpoints[call.rank],
            )  # fmt: skip
            self._settle(call)
        self._context.term()
        os.close(self._nudge_r)
        os.close(self._nudge_w)
        self._nudge_r = self._nudge_w = -1  # the numbers may be reused by other files

    # -- internals ---------------------------------------------------------------------

    def _forget(self, call: Call) -> None:
        with self._lock:
            removed = self._pending.pop(call.id, None)
        if removed is not None:
            self._slots.release()
            if call.slot is not None:  # the server may still write there: not reused yet
                self.replies.orphan(call.id, call.slot)

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

    def nudge(self) -> None:
        """Wake the I/O thread now (a close, a reconnect or new servers asked for)."""
        # a full pipe: the thread is awake already; -1: the channel is closed
        with contextlib.suppress(OSError):
            os.write(self._nudge_w, b"\0")

    def _run(self) -> None:
        poller = self._poller
        poller.register(self._nudge_r, zmq.POLLIN)
        with self._io:
            for rank in range(len(self._dealers)):
                self._watch(rank)
        try:
            while not self._closing.is_set():
                ready = poller.poll(_POLL_MS)
                if any(what == self._nudge_r for what, _ in ready):
                    while _nudged(self._nudge_r):
                        pass
                with self._io:
                    self._serve_revivals()
                    self._serve_growth()
                    for what, _ in ready:
                        watched = self._monitor_of.get(what)
                        if watched is not None and not what.closed:
                            self._on_event(watched, recv_monitor_message(what))
                    # replies nobody waits for yet (see channel_receive)
                    self._drain_all()
                    self._flush_backlogs()
        except zmq.ContextTerminated:  # pragma: no cover - close() joins first
            pass
        except Exception:  # pragma: no cover - a bug here must not hang callers silently
            log.exception("sparseps client I/O thread failed; pending requests will time out")

    def _forward(self, call: Call, frames: list) -> None:
        """Send ``call``'s frames on its server's DEALER (the caller, under the socket lock)."""
        rank = call.rank
        if self._lost[rank] is not None or self._refused[rank] is not None:
            # Fail at once rather than queue behind a handshake that keeps failing.
            self._fail_if_pending(call, self._lost[rank] or self._refused[rank])
            return
        backlog = self._backlog[rank]
        if backlog:  # keep the order of requests to one server
            backlog.append(frames)
            return
        try:
            transport.send_frames(self._dealers[rank], frames, flags=zmq.NOBLOCK)
        except zmq.Again:  # no usable connection yet: the I/O thread sends it later
            backlog.append(frames)

    def _flush_backlogs(self) -> None:
        """Send what zmq could not take before; fail it if the server refused us."""
        for rank, backlog in enumerate(self._backlog):
            while backlog:
                frames = backlog[0]
                call_id = peek_request_id(frames[:1])
                with self._lock:
                    waiting = call_id in self._pending
                if call_id is None or not waiting:  # its caller timed out and forgot it
                    backlog.popleft()
                    continue
                if self._refused[rank] is not None:
                    backlog.popleft()
                    with self._lock:
                        call = self._pending.pop(call_id, None)
                    if call is not None:
                        self._fail_unavailable(call, self._refused[rank])
                    continue
                try:
                    transport.send_frames(self._dealers[rank], frames, flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                backlog.popleft()
