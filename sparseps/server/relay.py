"""Replies that leave the server from threads other than the request loop.

The loop thread owns the server's ROUTER socket (zmq sockets are not thread-safe), so a
reply produced elsewhere travels to it: a write of a replicated shard is answered once the
next copy of its chain has it (:mod:`sparseps.server.shard_chain`, on that chain's
thread), and the writes a copy receives from the one before it are applied by a thread of
their own (:mod:`sparseps.server.forwarded`). Each such thread sends ``[client identity,
*reply frames]`` on a PUSH socket of its own to the loop's PULL socket; the loop puts the
reply on the ROUTER.

A :class:`Route` is where one request's reply goes: the identity of the peer's connection
and the request's id.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import zmq

from ..core.closing import Closing
from ..rpc import transport

__all__ = ["Relay", "Route"]

_instance = itertools.count()


@dataclass(frozen=True)
class Route:
    """Where a request's reply goes: the ROUTER identity of its sender, and its id."""

    identity: bytes
    request_id: int


class Relay(Closing):
    """The loop's inbound socket for replies made on other threads, and their senders.

    Args:
        context: the server's zmq context.
        rank: the server's rank (names the inproc address).
    """

    def __init__(self, context: zmq.Context, rank: int) -> None:
        self.context = context
        self.address = f"inproc://sparseps-relay-{rank}-{next(_instance)}"
        self.inbound = context.socket(zmq.PULL)
        self.inbound.setsockopt(zmq.LINGER, 0)
        self.inbound.bind(self.address)
        self._local = threading.local()
        self._senders: list[zmq.Socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def send(self, identity: bytes, frames: list) -> None:
        """Send a reply to the peer ``identity`` through the loop (from any thread but the
        loop's)."""
        sock = getattr(self._local, "sock", None)
        if sock is None:
            with self._lock:
                if self._closed:
                    return  # the server stops: nobody waits for this reply any more
                sock = self.context.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(self.address)
                self._senders.append(sock)
            self._local.sock = sock
        transport.send_frames(sock, [identity, *frames])

    def receive(self) -> list:
        """One relayed reply (the loop, when ``inbound`` is readable): ``[identity, ...]``."""
        return transport.recv_frames(self.inbound)

    def close(self) -> None:
        """Close every socket (at stop, once the sending threads are done)."""
        with self._lock:
            self._closed = True
            for sock in self._senders:
                sock.close(linger=0)
            self._senders.clear()
        self.inbound.close(linger=0)
