"""``ForwardedWrites``: the writes a copy of a replicated shard receives from the copy
before it in the shard's chain, applied by one thread in the order they arrive.

A copy must apply its shard's writes in the head's order (:mod:`.shard_chain`), and the
copy before it sends them in that order over one connection. The request loop hands them
here rather than answering them itself: applying one may wait for the chain's order lock
(a long op of the same shard, such as a load, holds it) and must never stall the loop,
and the pool's threads would apply them in any order. Answers leave through the relay.
"""

from __future__ import annotations

import logging
import queue
import threading

from ..rpc.protocol import Limits
from .handlers import ServerState
from .relay import Relay

__all__ = ["ForwardedWrites"]

log = logging.getLogger(__name__)


class ForwardedWrites:
    """The thread that applies writes passed down the chain, in arrival order.

    Args:
        state: the server's tables.
        limits: message limits.
        relay: where the answers leave (through the request loop).
        process: ``(state, frames, limits, peer, header, identity) -> reply frames or
            None`` (:func:`sparseps.server.loop.process`).
    """

    def __init__(self, state: ServerState, limits: Limits, relay: Relay, process) -> None:
        self.state = state
        self.limits = limits
        self.relay = relay
        self.process = process
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name=f"sparseps-server-{state.rank}-forwarded", daemon=True
        )
        self._thread.start()

    def put(self, identity: bytes, body: list, header: dict | None) -> None:
        """Queue one write passed on by another server (the loop thread)."""
        self._queue.put((identity, body, header))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            identity, body, header = item
            try:
                reply = self.process(
                    self.state, body, self.limits, identity.hex(), header, identity
                )
                if reply is not None:
                    self.relay.send(identity, reply)
            except Exception:  # pragma: no cover - the thread must go on
                log.exception("server %d: applying a forwarded write failed", self.state.rank)
