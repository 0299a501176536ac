"""``AppliedUpdates``: which ``(client, seq)`` updates a server has applied, so that an
update sent again after a timeout (:class:`~sparseps.rpc.channel.Channel` retries) is
applied once.

A client numbers its updates 1, 2, 3, ... (:data:`~sparseps.rpc.ops.UPDATE_OPS`). The
server remembers, per client, the most recent ``window`` sequence numbers it has started
or finished, and at most ``max_clients`` clients (the least recently seen are forgotten
first). A retry comes within a few RPC timeouts of the original, far inside the window,
so memory stays bounded (about 100 bytes per remembered update) while duplicates are
caught. An update that *failed* is forgotten, so its retry is applied.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque

__all__ = ["AppliedUpdates"]

WINDOW = 16_384
MAX_CLIENTS = 1_024


class _Client:
    __slots__ = ("order", "seen")

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.order: deque[int] = deque()


class AppliedUpdates:
    """Thread-safe record of started/applied updates, bounded per client and in clients.

    Args:
        window: sequence numbers remembered per client.
        max_clients: clients remembered.
    """

    def __init__(self, *, window: int = WINDOW, max_clients: int = MAX_CLIENTS) -> None:
        self.window = window
        self.max_clients = max_clients
        self._clients: OrderedDict[int, _Client] = OrderedDict()
        self._lock = threading.Lock()
        self.duplicates = 0

    def begin(self, client: int, seq: int) -> bool:
        """Claim ``(client, seq)``: True the first time (apply it), False for a repeat."""
        with self._lock:
            record = self._clients.get(client)
            if record is None:
                record = self._clients[client] = _Client()
                if len(self._clients) > self.max_clients:
                    self._clients.popitem(last=False)
            else:
                self._clients.move_to_end(client)
            if seq in record.seen:
                self.duplicates += 1
                return False
            record.seen.add(seq)
            record.order.append(seq)
            if len(record.order) > self.window:
                record.seen.discard(record.order.popleft())
            return True

    def export(self) -> list:
        """The remembered updates as ``[[client, [seq, ...]], ...]`` (oldest client first),
        for a replacement copy of this shard (:meth:`adopt`)."""
        with self._lock:
            return [[client, list(record.order)] for client, record in self._clients.items()]

    def adopt(self, exported: list) -> None:
        """Remember the updates of :meth:`export` (a copy taking over a shard)."""
        with self._lock:
            for client, seqs in exported:
                record = self._clients.setdefault(int(client), _Client())
                for seq in seqs[-self.window :]:
                    if seq not in record.seen:
                        record.seen.add(seq)
                        record.order.append(seq)

    def failed(self, client: int, seq: int) -> None:
        """Forget a claimed update that was not applied, so a retry can apply it."""
        with self._lock:
            record = self._clients.get(client)
            if record is not None:
                record.seen.discard(seq)
