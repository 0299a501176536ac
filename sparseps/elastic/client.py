"""``ElasticClient``: pull and push routed by the servers' placement, resent across moves.

Keys are deduplicated and grouped by owner with the placement's table (compiled, as
:class:`~sparseps.rpc.client.PSClient` groups them), one request per owner in parallel.
A server that no longer owns a key's virtual shard, or is handing it over, refuses the
whole request (nothing applied: :mod:`sparseps.server.elastic_ops`); the client then
fetches the newest placement from the servers and resends the refused part only, with a
short back-off, until ``retry_for`` seconds have passed. So a push is applied exactly
once, by the owner of the moment, and training only waits out a cut-over.

Example::

    with ElasticClient(endpoints) as client:
        client.create_table(TableConfig(name="emb", dim=8))
        rows = client.pull("emb", keys).wait()
        client.push("emb", keys, grads).wait()
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..config import TableConfig
from ..core.placement import Placement
from ..core.validate import check_key_array
from ..errors import DeadlineError, InputError
from ..rpc.batching import merge_by_group
from ..rpc.client_checks import check_counts_or_none, check_finite_rows
from .peers import Peers, is_placement_error

__all__ = ["ElasticClient", "RoutedHandle"]


class ElasticClient:
    """Pull/push on an elastic job (its servers hold a placement: :func:`install_placement`).

    Args:
        endpoints: any addresses of the job's servers (the placement names the rest).
        timeout: seconds per request.
        job_id: the job's id, if its servers check one.
        retry_for: seconds a refused request is resent for before the call fails.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 30.0,
                 job_id: str | None = None, retry_for: float = 60.0) -> None:  # fmt: skip
        self.peers = Peers(timeout=timeout, job_id=job_id)
        self.retry_for = float(retry_for)
        self.refreshes = 0
        placement = self.peers.newest(list(endpoints))
        if placement is None:
            self.peers.close()
            raise InputError(f"ElasticClient: the servers {list(endpoints)} hold no placement; "
                             "install one with sparseps.elastic.install_placement")  # fmt: skip
        self.placement: Placement = placement

    def __enter__(self) -> ElasticClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.peers.close()

    def refresh(self) -> Placement:
        """Take the newest placement any server of the current one holds."""
        live = [self.placement.endpoints[r] for r in self.placement.live_ranks()]
        newest = self.peers.newest(live, timeout=min(self.peers.timeout, 5.0))
        if newest is not None and newest.version > self.placement.version:
            self.placement = newest
        self.refreshes += 1
        return self.placement

    def create_table(self, config: TableConfig) -> None:
        """Create the table on every server of the placement (idempotent)."""
        for rank in self.placement.live_ranks():
            self.peers.client(self.placement.endpoints[rank]).create_table(config)

    def _routed(self, what: str, keys: np.ndarray, send, receive, finish) -> RoutedHandle:
        return RoutedHandle(self, what, keys, send, receive, finish)

    def pull(self, table: str, keys: np.ndarray) -> RoutedHandle:
        """Rows of ``keys`` (duplicates allowed); ``wait()`` -> float32 ``[len(keys), dim]``."""
        return self._rows("pull", table, keys)

    def pull_full(self, table: str, keys: np.ndarray) -> RoutedHandle:
        """Embedding and optimizer state of ``keys``; ``wait()`` -> float32
        ``[len(keys), dim + state_dim]`` (as :meth:`PSClient.pull_full`)."""
        return self._rows("pull_full", table, keys)

    def _rows(self, op: str, table: str, keys: np.ndarray) -> RoutedHandle:
        keys = check_key_array(f"{op} {table!r}", keys, contiguous=False)
        unique, inverse = np.unique(keys, return_inverse=True)
        out: list = [None]

        def send(endpoint, positions):
            return getattr(self.peers.client(endpoint), op)(table, unique[positions])

        def receive(positions, rows):
            if out[0] is None:
                out[0] = np.empty((len(unique), rows.shape[1]), np.float32)
            out[0][positions] = rows

        def finish():
            if out[0] is None:
                return np.empty((0, 0), np.float32)
            return out[0][inverse]

        return self._routed(f"{op} {table!r}", unique, send, receive, finish)

    def push(self, table: str, keys: np.ndarray, grads: np.ndarray,
             shows: np.ndarray | None = None, clicks: np.ndarray | None = None) -> RoutedHandle:  # fmt: skip
        """Apply gradients with the table's rule (each key once, by its owner);
        ``wait()`` -> None."""
        return self._push("push", table, keys, grads, shows, clicks)

    def push_delta(self, table: str, keys: np.ndarray, deltas: np.ndarray,
                   shows: np.ndarray | None = None,
                   clicks: np.ndarray | None = None) -> RoutedHandle:  # fmt: skip
        """Add ``deltas`` to the rows (as :meth:`PSClient.push_delta`); ``wait()`` -> None."""
        return self._push("push_delta", table, keys, deltas, shows, clicks)

    def write_rows(self, table: str, keys: np.ndarray, rows: np.ndarray,
                   shows: np.ndarray | None = None,
                   clicks: np.ndarray | None = None) -> RoutedHandle:  # fmt: skip
        """Overwrite embedding and state of ``keys`` (unique), add show/click (as
        :meth:`PSClient.write_rows`); ``wait()`` -> None."""
        what = f"write_rows {table!r}"
        keys = check_key_array(what, keys, contiguous=False)
        rows = check_finite_rows(rows, "rows", what, len(keys))
        shows = check_counts_or_none(shows, "shows", what, len(keys))
        clicks = check_counts_or_none(clicks, "clicks", what, len(keys))

        def part(values, positions):
            return None if values is None else values[positions]

        def send(endpoint, positions):
            return self.peers.client(endpoint).write_rows(
                table, keys[positions], rows[positions], part(shows, positions),
                part(clicks, positions),
            )  # fmt: skip

        return self._routed(what, keys, send, lambda positions, _: None, lambda: None)

    def _push(self, op: str, table: str, keys, grads, shows, clicks) -> RoutedHandle:
        what = f"{op} {table!r}"
        keys = check_key_array(what, keys, contiguous=False)
        grads = check_finite_rows(grads, "grads", what, len(keys))
        shows = check_counts_or_none(shows, "shows", what, len(keys))
        clicks = check_counts_or_none(clicks, "clicks", what, len(keys))
        if not len(keys):
            return self._routed(what, keys, None, None, lambda: None)
        unique, inverse = np.unique(keys, return_inverse=True)
        merged, m_shows, m_clicks = merge_by_group(inverse.astype(np.int64), len(unique),
                                                   grads, shows, clicks)  # fmt: skip

        def send(endpoint, positions):
            return getattr(self.peers.client(endpoint), op)(
                table, unique[positions], merged[positions], m_shows[positions], m_clicks[positions]
            )

        return self._routed(what, unique, send, lambda positions, _: None, lambda: None)


class RoutedHandle:
    """The requests of one call, one per owner, sent at once; ``wait()`` resends what a
    server refused for a placement reason (after a refresh) and returns the result."""

    def __init__(self, client: ElasticClient, what: str, keys: np.ndarray, send, receive,
                 finish) -> None:  # fmt: skip
        self._client, self._what, self._keys = client, what, keys
        self._send, self._receive, self._finish = send, receive, finish
        self._sent = self._dispatch(np.arange(len(keys))) if len(keys) else []
        self._done = False
        self._value = None

    def _dispatch(self, todo: np.ndarray) -> list:
        placement = self._client.placement
        owners = placement.owner_of(self._keys[todo])
        order = np.argsort(owners, kind="stable")
        ranks, starts = np.unique(owners[order], return_index=True)
        bounds = [*starts[1:], len(order)]
        sent = []
        for rank, lo, hi in zip(ranks, starts, bounds, strict=True):
            positions = todo[order[lo:hi]]
            sent.append((positions, self._send(placement.endpoints[rank], positions)))
        return sent

    def wait(self, timeout: float | None = None):
        """The result; resends refused parts for up to the client's ``retry_for`` seconds.

        Raises:
            DeadlineError: servers kept refusing keys for ``retry_for`` seconds.
            RemoteError / DeadlineError: as :meth:`PSClient.pull` / ``push`` otherwise.
        """
        if self._done:
            return self._value
        client = self._client
        deadline = time.monotonic() + client.retry_for
        pause = 0.002
        while self._sent:
            refused = []
            for positions, handle in self._sent:
                try:
                    self._receive(positions, handle.wait(timeout))
                except Exception as exc:
                    if not is_placement_error(exc):
                        raise
                    refused.append(positions)
            self._sent = []
            if not refused:
                break
            if time.monotonic() > deadline:
                raise DeadlineError(
                    f"{self._what}: servers kept refusing {sum(map(len, refused))} keys for "
                    f"{client.retry_for:g} s (placement version {client.placement.version}); "
                    "raise ElasticClient(retry_for=...) if a migration takes longer",
                    op=self._what,
                    seconds=client.retry_for,
                    setting="ElasticClient(retry_for=...)",
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            client.refresh()
            self._sent = self._dispatch(np.concatenate(refused))
        self._value, self._done = self._finish(), True
        return self._value
