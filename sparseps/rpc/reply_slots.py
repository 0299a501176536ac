"""Reply slots: a same-host client's pull answers written by the server into shared memory.

On one host, a pull's rows crossing loopback TCP cost two copies of every byte in the
kernel and the TCP stack's work on both sides; on a 2-vCPU machine that is most of what
separates a pull through a server from the same pull on an in-process table
(bench/RESULTS.md, rpc). So a client whose server runs on its host asks once for a
*segment* (op ``attach_replies``): a file in ``/dev/shm`` that the server creates and
both map, cut into ``slots`` equal slots after a header page. A pull may then name one
free slot (request header ``"slot": [segment, index]``); the server gathers the rows
straight into it and answers with the header alone (``"slot": true``); the caller's rows
are an array over the slot, no byte copied on the way.

Who owns what:

- The server creates the file (mode 0600, ``O_EXCL``, its space reserved with
  ``posix_fallocate``, so a write never finds a full tmpfs as ``SIGBUS``) and writes a
  random token at its start. The client maps it, checks the token (it sees the server's
  own file: the same host) and unlinks the name at once; the server unlinks it too after
  a grace period, so no name outlives a client that died attaching
  (:mod:`sparseps.server.reply_segments`).
- The client owns the slots: it names only a free one, and a slot is free again when the
  arrays of the reply in it are garbage (a finalizer on the lease every such array refers
  to). A call given up on (timeout) keeps its slot out of use until its late reply
  arrives, since the server may still write there.
- The server writes only into the slot a request names, never past it; a reply that does
  not fit goes over the socket as before, as does every reply when no slot is free, the
  segment is unknown to the server (``"detached": true``: a restarted server; the client
  attaches again) or the client did not attach (another host, no ``/dev/shm``, slots off).

Layout of a slot: the reply's buffers in order, each at the next multiple of
:data:`ALIGN` bytes (:func:`slot_layout`, used by both sides).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import ipaddress
import logging
import mmap
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from functools import cache
from math import prod

import numpy as np

from ..env import parse_endpoint
from ..errors import ProtocolError, SparsePSError
from .protocol import Reply

__all__ = [
    "ALIGN",
    "DEFAULT_SLOTS",
    "DEFAULT_SLOT_BYTES",
    "HEADER_BYTES",
    "MAX_SLOTS",
    "MAX_SLOT_BYTES",
    "MIN_SLOT_BYTES",
    "SEGMENT_DIR",
    "SEGMENT_PREFIX",
    "ReplySlots",
    "SlotOffers",
    "same_host",
    "slot_layout",
    "worth_a_slot",
]

log = logging.getLogger(__name__)

# The segment's first page holds the token; the slots follow, page-aligned.
HEADER_BYTES = 4096
TOKEN_BYTES = 16
ALIGN = 64
DEFAULT_SLOTS = 8
# 2 MiB: a pull of 8192 keys of dim 64 (or 32768 of dim 16).
DEFAULT_SLOT_BYTES = 2 << 20
MAX_SLOTS = 64
MIN_SLOT_BYTES = 64 << 10
MAX_SLOT_BYTES = 64 << 20
# Where segments live, and their names: sparseps-replies-<server pid>-<random hex>.
SEGMENT_DIR = "/dev/shm"
SEGMENT_PREFIX = "sparseps-replies-"
_SEGMENT_NAME = re.compile(re.escape(SEGMENT_PREFIX) + r"[0-9]{1,10}-[0-9a-f]{16,64}")
# Pulls of fewer keys answer over the socket: for a few rows the slot's bookkeeping (a
# lease and its finalizer per reply) costs more than the copies it saves.
MIN_SLOT_KEYS = 256
# After a failed attach (the server refused, or answered late), try again this much later.
RETRY_ATTACH_S = 60.0
# The longest a request waits for its server's attach answer (the attach is sent first,
# on the request's own thread). Past it the request goes over the socket and meets its
# server as any request would: a stopped same-host server held an elastic worker's first
# big pull for the whole RPC timeout (60 s) inside the attach, where the placement
# router's watch of the connection never saw it. A segment its late answer made is the
# server's to sweep (``sparseps.server.reply_segments.IDLE_S``).
ATTACH_WAIT_S = 2.0


def slot_layout(described: Sequence[tuple[np.dtype, Sequence[int]]]) -> tuple[list[int], int]:
    """``(offset of each buffer, bytes in all)`` of buffers laid out in one slot."""
    offsets, end = [], 0
    for dtype, shape in described:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + prod(shape) * dtype.itemsize
    return offsets, end


def worth_a_slot(bufs: Sequence[np.ndarray]) -> bool:
    """Whether a request with these buffers is offered a slot: one without buffers (a
    dense pull) or whose keys are many (:data:`MIN_SLOT_KEYS`)."""
    return not bufs or bufs[0].shape[0] >= MIN_SLOT_KEYS


@cache
def _own_addresses() -> frozenset[str]:
    try:
        return frozenset(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        return frozenset()


def same_host(host: str) -> bool:
    """Whether a server at ``host`` may share this host's memory: a loopback address or
    one of this host's own. (The attach's token check is the proof; this only spares a
    remote server the question.)"""
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return True
    return host in _own_addresses() or host == socket.gethostname()


class _Lease:
    """What every array of one reply in a slot refers to (numpy keeps a view's first
    non-array base alive): when the last of them is garbage, the slot is free again."""

    def __init__(self, memory: np.ndarray) -> None:
        self._memory = memory  # keeps the mapping alive while any array uses it
        self.__array_interface__ = {
            "data": (memory.ctypes.data, False),
            "shape": memory.shape,
            "typestr": "|u1",
            "version": 3,
        }


class ReplySlots:
    """A client's mapping of one server's segment and the ownership of its slots.

    Args:
        answer: the server's answer to ``attach_replies`` (segment, path, token, slots,
            slot_bytes).

    Raises:
        OSError: the file cannot be opened or mapped (another host, another user).
        SparsePSError: the file is not the one the server described (size or token).
    """

    def __init__(self, answer: dict) -> None:
        self.segment = int(answer["segment"])
        self.slots = int(answer["slots"])
        self.slot_bytes = int(answer["slot_bytes"])
        path = str(answer["path"])
        directory, _, name = path.rpartition("/")
        if directory != SEGMENT_DIR or not _SEGMENT_NAME.fullmatch(name):
            # never map a file the server merely names: it must be one of the segments
            raise SparsePSError(
                f"reply segment {path!r:.200} is not a {SEGMENT_DIR}/{SEGMENT_PREFIX}* name"
            )
        if not (
            1 <= self.slots <= MAX_SLOTS and MIN_SLOT_BYTES <= self.slot_bytes <= MAX_SLOT_BYTES
        ):
            raise SparsePSError(
                f"reply segment {path}: {self.slots} slots of {self.slot_bytes} bytes is out of range"
            )
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            size = HEADER_BYTES + self.slots * self.slot_bytes
            if os.fstat(fd).st_size != size:
                raise SparsePSError(
                    f"reply segment {path}: {os.fstat(fd).st_size} bytes, expected {size}"
                )
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        # the token proves it is the server's own file: a name alone could be another host's
        if self._map[:TOKEN_BYTES] != bytes(answer["token"]):
            self._map.close()
            raise SparsePSError(
                f"reply segment {path}: the token does not match (not the server's file)"
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # mapped on both sides: the name is no longer needed
        self._memory = np.frombuffer(self._map, np.uint8)
        # deque append/pop are atomic: finalizers may run on any thread, at any time. Last
        # freed, first taken: that slot's memory is the likeliest to be in the caches.
        self._free = collections.deque(range(self.slots))

    def take(self) -> int | None:
        """A free slot's index, now the caller's, or None when every slot is in use."""
        try:
            return self._free.pop()
        except IndexError:
            return None

    def release(self, index: int) -> None:
        """Slot ``index`` is free again (its reply never arrived in it, or was dropped)."""
        self._free.append(index)

    def arrays(
        self, index: int, described: Sequence[tuple[np.dtype, Sequence[int]]]
    ) -> tuple[np.ndarray, ...]:
        """The buffers of the reply the server wrote into slot ``index`` (writable views;
        the slot is free again when all of them are garbage).

        Raises:
            ProtocolError: the buffers described do not fit in a slot (the slot is freed).
        """
        offsets, total = slot_layout(described)
        if total > self.slot_bytes:
            self.release(index)
            raise ProtocolError(f"a reply of {total} bytes claims a slot of {self.slot_bytes}")
        start = HEADER_BYTES + index * self.slot_bytes
        lease = _Lease(self._memory[start : start + self.slot_bytes])
        weakref.finalize(lease, self._free.append, index)
        memory = np.asarray(lease)
        return tuple(
            memory[offset : offset + prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
            for offset, (dtype, shape) in zip(offsets, described, strict=True)
        )

    @property
    def free(self) -> int:
        """Slots not in use now."""
        return len(self._free)


class SlotOffers:
    """A channel's reply slots: which server it attached to, which slot each call holds.

    Args:
        attach: sends ``attach_replies`` to a rank and returns the server's answer within
            :data:`ATTACH_WAIT_S` (raises whatever the call raises).
        slots, slot_bytes: the segment asked of each server (``slots=0``: never attach).
    """

    def __init__(self, attach: Callable[[int, dict], dict], *, slots: int, slot_bytes: int) -> None:
        self._attach = attach
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._lock = threading.Lock()
        # endpoint -> its mapping, or the time after which to try attaching again
        self._by_endpoint: dict[str, ReplySlots | float] = {}
        # request id -> the slot of a call given up on: it is free when its reply arrives
        self._orphans: dict[int, tuple[ReplySlots, int]] = {}

    def offer(self, rank: int, endpoint: str) -> tuple[ReplySlots, int] | None:
        """A slot for a request to ``rank`` at ``endpoint`` (attaching to its server
        first), or None."""
        if not self.slots:
            return None
        held = self._by_endpoint.get(endpoint)
        if isinstance(held, ReplySlots):
            index = held.take()
            return None if index is None else (held, index)
        if (held is not None and time.monotonic() < held) or not same_host(
            parse_endpoint(endpoint)[0]
        ):
            return None
        with self._lock:  # one attach per server at a time; the others go over the socket
            if self._by_endpoint.get(endpoint, held) is not held:
                return None
            self._by_endpoint[endpoint] = time.monotonic() + RETRY_ATTACH_S
        try:
            pool = ReplySlots(
                self._attach(rank, {"slots": self.slots, "slot_bytes": self.slot_bytes})
            )
        except (OSError, SparsePSError) as exc:  # not fatal: replies keep using the socket
            log.info(
                "server %d at %s: replies stay on the socket (no shared slots: %s)",
                rank,
                endpoint,
                exc,
            )
            return None
        self._by_endpoint[endpoint] = pool
        index = pool.take()
        return None if index is None else (pool, index)

    @staticmethod
    def give_back(slot: tuple[ReplySlots, int] | None) -> None:
        """A slot offered for a request that will never be answered into it is free again."""
        if slot is not None:
            slot[0].release(slot[1])

    def detach(self, endpoint: str, pool: ReplySlots) -> None:
        """The server no longer knows ``pool``'s segment (it restarted): attach again."""
        with self._lock:
            if self._by_endpoint.get(endpoint) is pool:
                del self._by_endpoint[endpoint]

    def receive(self, slot: tuple[ReplySlots, int] | None, reply: Reply, endpoint: str) -> Reply:
        """``reply`` to a call that held ``slot``, with its buffers read from the slot when
        the server wrote them there; a slot the reply did not use is free again.

        Raises:
            ProtocolError: the reply claims a slot the request did not offer, or more of
                it than there is.
        """
        if slot is None:
            if reply.slot_bufs is not None:
                raise ProtocolError("the answer is in a reply slot the request did not offer")
            return reply
        pool, index = slot
        if reply.slot_bufs is None:  # over the socket (or an error)
            pool.release(index)
            if reply.detached:
                self.detach(endpoint, pool)
            return reply
        return dataclasses.replace(reply, bufs=pool.arrays(index, reply.slot_bufs), slot_bufs=None)

    def orphan(self, request_id: int, slot: tuple[ReplySlots, int]) -> None:
        """The call of ``request_id`` was given up on: its slot waits for the late reply."""
        with self._lock:
            self._orphans[request_id] = slot

    def late_reply(self, request_id: int | None) -> None:
        """A reply nobody waits for arrived: a slot its call held is free again."""
        if request_id is None or not self._orphans:
            return
        with self._lock:
            slot = self._orphans.pop(request_id, None)
        self.give_back(slot)

    def attached(self) -> dict[str, int]:
        """endpoint -> free slots, for every server this channel shares slots with."""
        return {e: p.free for e, p in list(self._by_endpoint.items()) if isinstance(p, ReplySlots)}
