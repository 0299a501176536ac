"""A full mesh of CURVE links among the ranks of one group: the secure collectives' wire.

A ``--secure`` job's worker collectives (:mod:`sparseps.runtime.curve_group`) travel here
instead of over gloo's plain TCP pairs. Each rank binds ONE PULL socket on its interface
(a CURVE server behind the job's one-key ZAP handler, like every listening socket of a
secure job: a peer without the job's key gets past no handshake and nothing it sends is
read) and connects one PUSH socket to every other rank's (a CURVE client). Addresses are
exchanged on the group's store (the job's CURVE store), the mesh is ready once every
outgoing handshake succeeded.

A message is two frames: a 16-byte header (:data:`HEADER`: kind, op code, step, sequence
number or tag, sender) and the payload, raw bytes. A receive thread reads the PULL socket
and files every message by its key: a collective's ``(seq, step, sender)``, taken by the
rank's collective thread (:meth:`Mesh.take`); a point-to-point ``(sender, tag)`` in order,
handed to the receive posted for it or held until one is (:meth:`Mesh.post_recv`). Held
messages are bounded by the protocol, not by a count: a rank runs at most one collective
ahead of a peer that has not contributed (it cannot finish without it), except a
broadcast's root and point-to-point sends, which, as with gloo, are held until received.

A peer is *gone* when it says so (a ``bye`` after its last message, sent when its group
shuts down) or when its link closes and no ``bye`` follows within :data:`GONE_GRACE_S`
(a crash; the grace covers its last messages still in flight on the other link). Waits on
a gone peer fail at once with :class:`GroupError` (a ``RuntimeError``, as torch raises for
a failed collective); a wait past its deadline raises one whose text says "timed out".
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..core.closing import Closing
from .security import Security, handshake_failed_events

__all__ = ["BYE", "COLLECTIVE", "GONE_GRACE_S", "HEADER", "P2P", "GroupError", "Mesh"]

log = logging.getLogger(__name__)

HEADER = struct.Struct("<BBHqI")  # kind, op code, step, seq (collective) or tag (p2p), sender
COLLECTIVE, P2P, BYE = 1, 2, 3
GONE_GRACE_S = 5.0  # a closed link without a bye: how long its last messages may still come
_CLOSE_LINGER_MS = 5000  # flushing the last messages to live peers when the group shuts down
_POLL_MS = 500
_STORE_LOST_GRACE_S = 2.0  # the store went away: how long a refusal of our key may take to show
_TOLD_S = 5.0  # a failed set-up: how long it waits for its peers to read why (see _tell_peers)

Frame = zmq.Frame
OnMessage = Callable[[Frame | None, "GroupError | None"], None]


class GroupError(RuntimeError):
    """A collective of the secure group failed: a peer left, a wait timed out, a message
    was malformed. A ``RuntimeError`` because that is what torch raises for a failed
    collective (:func:`sparseps.core.deadline.wait_collective` names it from there)."""


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the mesh uses."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...


class Mesh(Closing):
    """The links of one rank to every other rank of a group (module docstring).

    Args:
        store: the group's store (rendezvous of the addresses).
        rank, size: this rank and the group's size (> 1).
        security: the job's keys: the PULL socket is a CURVE server, the PUSHes clients.
        host: the IP address to listen on (the interface the other ranks reach).
        timeout_s: how long the rendezvous and each send may take.

    Raises:
        GroupError: a peer did not publish its address or complete a handshake within
            ``timeout_s``, or refused this rank's key (names the peer and the key folder).
    """

    def __init__(
        self, store: Store, rank: int, size: int, *, security: Security, host: str,
        timeout_s: float,
    ) -> None:  # fmt: skip
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self.peers = [p for p in range(size) if p != rank]
        self._security = security
        self._cond = threading.Condition()
        self._held: dict[tuple[int, int, int], tuple[int, Frame]] = {}
        self._unexpected: dict[tuple[int, int], deque[Frame]] = {}
        self._posted: dict[tuple[int, int], deque[OnMessage]] = {}
        self._closed_at: dict[int, float] = {}  # peer -> when its link closed (no bye yet)
        self._gone: dict[int, str] = {}  # peer -> why it is gone
        self._broken: str | None = None
        self._stop = threading.Event()
        self._send_locks = {p: threading.Lock() for p in self.peers}
        self._in = zmq.Context(io_threads=1)  # the PULL side: closed last
        self._out = zmq.Context(io_threads=1)  # the PUSH side: flushed first
        self._pushes: dict[int, zmq.Socket] = {}
        self._monitors: dict[zmq.Socket, int] = {}
        try:
            self._auth = security.authenticator(self._in)
            self._pull = self._in.socket(zmq.PULL)
            self._pull.setsockopt(zmq.LINGER, 0)
            self._pull.setsockopt(zmq.IPV6, int(":" in host))
            security.server_socket(self._pull)
            self._pull.bind(_endpoint(host, "*"))
            port = int(self._pull.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
            self.address = f"{host}:{port}"
            self._wake_rx = self._in.socket(zmq.PAIR)
            self._wake_rx.bind(f"inproc://mesh-wake-{id(self)}")
            self._wake_tx = self._in.socket(zmq.PAIR)
            self._wake_tx.setsockopt(zmq.LINGER, 0)
            self._wake_tx.connect(f"inproc://mesh-wake-{id(self)}")
            self._connect(store)
        except BaseException as exc:
            self._teardown(flush=False)
            if isinstance(exc, GroupError):  # the peers waiting on this rank learn why at once
                with contextlib.suppress(Exception):
                    self._tell_peers(store, str(exc))
            raise
        self._thread = threading.Thread(target=self._run, name="sparseps-mesh", daemon=True)
        self._thread.start()

    # -- set-up -------------------------------------------------------------------------

    def _connect(self, store: Store) -> None:
        store.set(f"mesh/{self.rank}", self.address)
        keys = [f"mesh/{p}" for p in self.peers]
        try:
            store.wait(keys, timedelta(seconds=self.timeout_s))
        except Exception as exc:
            raise GroupError(
                f"secure group: rank {self.rank} did not get every peer's address within "
                f"{self.timeout_s:.0f} s (timed out; {exc})"
            ) from None
        addresses = {p: store.get(f"mesh/{p}").decode() for p in self.peers}
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | handshake_failed_events()
        for peer, address in addresses.items():
            sock = self._out.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, int(self.timeout_s * 1000))
            sock.setsockopt(zmq.IPV6, int(":" in address.rsplit(":", 1)[0]))
            self._security.client_socket(sock)
            self._monitors[sock.get_monitor_socket(events)] = peer
            sock.connect(_endpoint(*address.rsplit(":", 1)))
            self._pushes[peer] = sock
        self._await_handshakes(store, addresses)

    def _tell_peers(self, store: Store, why: str) -> None:
        """Publish why this rank's set-up failed, then wait (up to :data:`_TOLD_S`) until
        each peer it connected to has read it or failed on its own. The store may live in
        this process (rank 0 hosts it), which exits once this raises: a peer that had not
        read why yet (it looks every ``_POLL_MS``) could then only report a lost store,
        its own link to this rank never having got as far as the refusal of its key."""
        store.set(f"mesh/failed/{self.rank}", why)
        unread = set(self._pushes)
        deadline = time.monotonic() + _TOLD_S
        while unread and time.monotonic() < deadline:
            unread = {
                p for p in unread
                if not store.check([f"mesh/read/{self.rank}/{p}"])
                and not store.check([f"mesh/failed/{p}"])
            }  # fmt: skip
            if unread:
                time.sleep(0.02)

    def _await_handshakes(self, store: Store, addresses: dict[int, str]) -> None:
        """Until every link's handshake succeeded; a peer whose own set-up failed (it
        published why) or that refuses this rank's key fails this rank's too."""
        poller = zmq.Poller()
        for monitor in self._monitors:
            poller.register(monitor, zmq.POLLIN)
        waiting = set(self.peers)
        deadline = time.monotonic() + self.timeout_s
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GroupError(
                    f"secure group: rank {self.rank} timed out after {self.timeout_s:.0f} s "
                    f"connecting to rank(s) {sorted(waiting)} at "
                    f"{[addresses[p] for p in sorted(waiting)]}"
                )
            for peer in sorted(waiting):
                try:
                    failed = store.check([f"mesh/failed/{peer}"])
                except Exception as exc:  # noqa: BLE001 - any store's "gone": see below
                    # the store's host (rank 0) exits once its own set-up failed, often
                    # because it refused this rank's key: that refusal is on a monitor
                    # within moments, and it is the cause to report
                    self._watch_handshakes(poller, waiting, addresses, _STORE_LOST_GRACE_S)
                    raise GroupError(
                        f"secure group: rank {self.rank} lost the group's store while "
                        f"connecting ({exc})"
                    ) from None
                if failed:
                    why = store.get(f"mesh/failed/{peer}").decode()
                    store.set(f"mesh/read/{peer}/{self.rank}", "1")  # it waits for this
                    raise GroupError(f"secure group: rank {peer} could not join: {why}")
            self._watch_handshakes(poller, waiting, addresses, min(remaining, _POLL_MS / 1e3))

    def _watch_handshakes(
        self, poller: zmq.Poller, waiting: set[int], addresses: dict[int, str], seconds: float
    ) -> None:
        """Read the links' handshake events for up to ``seconds``: a success takes the
        peer off ``waiting``; a refusal of this rank's key raises :class:`GroupError`."""
        deadline = time.monotonic() + seconds
        while waiting and (left := deadline - time.monotonic()) > 0:
            for monitor, _ in poller.poll(int(left * 1000) + 1):
                peer = self._monitors[monitor]
                event = recv_monitor_message(monitor)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    waiting.discard(peer)
                elif event & handshake_failed_events():
                    raise GroupError(
                        f"secure group: rank {peer} at {addresses[peer]} refused the key of "
                        f"rank {self.rank} ({zmq.Event(event).name}); every worker must "
                        f"load the same job keys (this one: {self._security.key_dir or 'in memory'})"
                    )
            if seconds <= _POLL_MS / 1e3:  # the set-up loop's one round: back to the store
                return

    # -- sending --------------------------------------------------------------------------

    def send(
        self, peer: int, kind: int, op: int, step: int, seq: int, payload, *, track: bool = False
    ) -> zmq.MessageTracker | None:
        """Queue one message to ``peer``; the payload is sent without a copy.

        Returns the message's tracker when ``track`` (done once zmq no longer reads the
        payload: only then may the caller write into it).

        Raises:
            GroupError: ``peer`` is gone, or its queue stayed full for ``timeout_s``.
        """
        self.check(peer)
        header = HEADER.pack(kind, op, step, seq, self.rank)
        try:
            with self._send_locks[peer]:
                return self._pushes[peer].send_multipart([header, payload], copy=False, track=track)
        except zmq.Again:
            raise GroupError(
                f"secure group: sending to rank {peer} timed out after {self.timeout_s:.0f} s "
                "(its queue is full: it stopped reading)"
            ) from None
        except zmq.ZMQError as exc:
            raise GroupError(f"secure group: cannot send to rank {peer} ({exc})") from None

    # -- receiving ------------------------------------------------------------------------

    def take(self, seq: int, step: int, peer: int, op: int, deadline: float, what: str) -> Frame:
        """The payload of collective ``seq``'s ``step`` from ``peer``, waiting until
        ``deadline`` (``time.monotonic()``).

        Raises:
            GroupError: the peer is gone, the group broke, the peer ran another collective
                as number ``seq`` (the workers called collectives in a different order),
                or the deadline passed ("timed out").
        """
        key = (seq, step, peer)
        with self._cond:
            while key not in self._held:
                self.check(peer)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise GroupError(
                        f"secure group: {what} timed out after waiting for rank {peer}"
                    )
                self._cond.wait(remaining)
            sent_op, frame = self._held.pop(key)
        if sent_op != op:
            self._break(
                f"rank {peer} ran another collective as number {seq} (op code {sent_op}, "
                f"this rank's is {op}): the workers called collectives in a different order"
            )
            self.check(peer)
        return frame

    def post_recv(self, peer: int, tag: int, on_message: OnMessage) -> None:
        """Hand the next point-to-point message from ``peer`` with ``tag`` to
        ``on_message(frame, None)`` (now, if one is held), or ``(None, error)`` when the
        peer is gone or the group broke first."""
        key = (peer, tag)
        frame = None
        with self._cond:
            error = self._error(peer)
            held = self._unexpected.get(key)
            if held:
                frame, error = held.popleft(), None
            elif error is None:
                self._posted.setdefault(key, deque()).append(on_message)
                return
        on_message(frame, error)

    def check(self, peer: int | None = None) -> None:
        """Raise the group's :class:`GroupError` if it broke, or if ``peer`` is gone."""
        error = self._error(peer)
        if error is not None:
            raise error

    def _error(self, peer: int | None) -> GroupError | None:
        if self._broken is not None:
            return GroupError(f"secure group: {self._broken}")
        if peer is not None and peer in self._gone:
            return GroupError(f"secure group: rank {peer} left the group ({self._gone[peer]})")
        return None

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in (self._pull, self._wake_rx, *self._monitors):
            poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(_POLL_MS))
                if self._pull in ready:
                    self._drain()
                for monitor, peer in self._monitors.items():
                    if monitor in ready:
                        self._watch(monitor, peer)
                self._expire()
        except zmq.ContextTerminated:  # pragma: no cover - close() stops us first
            pass
        except Exception as exc:  # pragma: no cover - a bug here must fail the group, not hang it
            log.exception("secure group: the receive thread failed")
            self._break(f"its receive thread failed ({exc!r})")

    def _drain(self) -> None:
        for _ in range(1000):  # a batch, then look at the links and the stop flag
            try:
                frames = self._pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._file(frames)

    def _file(self, frames: list[Frame]) -> None:
        header = frames[0].bytes
        if len(frames) != 2 or len(header) != HEADER.size:
            self._break(f"a malformed message ({len(frames)} frames, header {len(header)} B)")
            return
        kind, op, step, seq, sender = HEADER.unpack(header)
        if sender == self.rank or not 0 <= sender < self.size or kind not in (COLLECTIVE, P2P, BYE):
            self._break(f"a malformed message header (kind {kind}, sender {sender})")
            return
        deliver: OnMessage | None = None
        with self._cond:
            if kind == COLLECTIVE:
                self._held[(seq, step, sender)] = (op, frames[1])
            elif kind == BYE:
                self._gone.setdefault(sender, "it shut its group down")
                self._fail_posted(sender)
            else:
                posted = self._posted.get((sender, seq))
                if posted:
                    deliver = posted.popleft()
                else:
                    self._unexpected.setdefault((sender, seq), deque()).append(frames[1])
            self._cond.notify_all()
        if deliver is not None:
            deliver(frames[1], None)

    def _watch(self, monitor: zmq.Socket, peer: int) -> None:
        while monitor.poll(0):
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._drain()  # what it sent before it left is filed first
                with self._cond:
                    self._closed_at.setdefault(peer, time.monotonic())
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                with self._cond:
                    self._closed_at.pop(peer, None)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._cond:
            for peer, since in list(self._closed_at.items()):
                if now - since >= GONE_GRACE_S and peer not in self._gone:
                    self._gone[peer] = "its connection closed: the process exited or crashed"
                    self._fail_posted(peer)
                    self._cond.notify_all()

    def _fail_posted(self, peer: int | None) -> None:
        """Fail the receives posted on ``peer`` (every peer: None), under the lock (the
        callbacks only record the error)."""
        error = self._error(peer)
        for (sender, _), waiting in self._posted.items():
            if peer is None or sender == peer:
                while waiting:
                    waiting.popleft()(None, error)

    def _break(self, why: str, *, quiet: bool = False) -> None:
        with self._cond:
            if self._broken is None:
                self._broken = why
                if not quiet:
                    log.error("secure group broke: %s", why)
            self._fail_posted(None)
            self._cond.notify_all()

    # -- lifecycle ------------------------------------------------------------------------

    def abort(self, why: str) -> None:
        """Break the group: every wait, now and later, fails with ``why``."""
        self._break(why)

    def close(self) -> None:
        """Say ``bye`` to every peer, flush what is queued to live ones (bounded), close
        (idempotent). A peer waiting on this rank then fails at once."""
        if self._stop.is_set():
            return
        for peer in self.peers:
            if peer not in self._gone:
                with contextlib.suppress(zmq.ZMQError), self._send_locks[peer]:
                    self._pushes[peer].send_multipart(
                        [HEADER.pack(BYE, 0, 0, 0, self.rank), b""], zmq.NOBLOCK
                    )
        self._stop.set()
        with contextlib.suppress(zmq.ZMQError):
            self._wake_tx.send(b"", zmq.NOBLOCK)
        self._thread.join(timeout=5.0)
        self._break("it was shut down on this rank", quiet=True)
        self._teardown(flush=True)

    def _teardown(self, *, flush: bool) -> None:
        # PUSHes first, flushed to live peers (their term() waits for it), the PULL last:
        # a peer sees this rank's links close only after its last messages went out.
        for peer, sock in self._pushes.items():
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            live = flush and peer not in self._gone
            sock.close(linger=_CLOSE_LINGER_MS if live else 0)
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._out.term()
        if not hasattr(self, "_auth"):  # the authenticator did not start
            self._in.term()
            return
        for name in ("_pull", "_wake_rx", "_wake_tx"):
            inbound = getattr(self, name, None)
            if inbound is not None:
                inbound.close(linger=0)
        self._auth.close()
        self._in.term()

    def __repr__(self) -> str:
        return f"Mesh(rank={self.rank}, size={self.size}, address={self.address!r})"


def _endpoint(ip: str, port: int | str) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"
