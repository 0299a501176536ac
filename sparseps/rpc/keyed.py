"""Keyed calls: the keys of one call grouped by owner, one request per owner, and the
handle that puts the answers back in the caller's order.

``pull``, ``prefetch``, ``push``, ``push_delta``, ``pull_full`` and ``write_rows`` all
take a key array. The client's router groups the keys by owner in one compiled pass
(:meth:`Router.group <sparseps.rpc.router.Router.group>`: a pull's keys as given, the
others' deduplicated), :func:`owner_parts` cuts the grouped keys and their columns
(gradients, counts, rows) into one request per owner, and a :class:`KeyedHandle` waits for
the answers; :func:`rows_of` writes the rows of a pull back in the caller's order.

A server that holds a placement (the job turned elastic since this client last looked)
refuses the keys of virtual shards it does not own, applying nothing. A plain-routed
call hands such a refused part to its client's ``take_over`` (the client switches to its
placement router and resends the part by owner: :mod:`sparseps.elastic.routing`); without
one (``follow_placement=False``) the refusal is the call's error. Nothing of the elastic
code runs for a call that no server refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.placement import PlacementError
from ..errors import ProtocolError, RemoteError
from .handle import Handle

if TYPE_CHECKING:
    from .call import Call
    from .channel import Channel
    from .protocol import Reply
    from .replicated import ShardRequest

__all__ = [
    "PLACEMENT_REFUSAL",
    "KeyedBatch",
    "KeyedHandle",
    "TakeOver",
    "owner_parts",
    "positions_of",
    "rows_of",
]

# The remote type of a server's refusal of keys it does not own under its placement:
# nothing of the request was applied.
PLACEMENT_REFUSAL = PlacementError.__name__

# What a part of a keyed call is: (its positions in the grouped keys, its reply)
Answered = tuple[slice | np.ndarray, "Reply"]


@dataclass(frozen=True)
class KeyedBatch:
    """What one keyed call sends: its op and table, its keys grouped by owner and the
    columns aligned with them (a push's gradients and counts; nothing for a pull)."""

    op: str
    table: str
    keys: np.ndarray
    columns: Sequence[np.ndarray]


# A plain-routed call's refused part, sent again by placement: (batch, refused positions
# in batch.keys, seconds per wait) -> the answered parts of it.
TakeOver = Callable[[KeyedBatch, np.ndarray, float], list[Answered]]


def owner_parts(offsets: np.ndarray, empty_owner: int) -> list[tuple[int, slice]]:
    """``(owner, slice of the grouped keys)`` of each owner with keys; one part of the
    ``empty_owner`` when there are no keys (a call is always sent, and answered)."""
    if int(offsets[-1]) == 0:
        return [(empty_owner, slice(0, 0))]
    if len(offsets) == 2:  # one owner holds every key (one server)
        return [(0, slice(0, int(offsets[1])))]
    owners = np.flatnonzero(np.diff(offsets)).tolist()
    return [(owner, slice(int(offsets[owner]), int(offsets[owner + 1]))) for owner in owners]


def positions_of(part: slice | np.ndarray) -> np.ndarray:
    """A part's positions in the grouped keys as an index array."""
    if isinstance(part, slice):
        return np.arange(part.start, part.stop, dtype=np.int64)
    return part


class KeyedHandle(Handle):
    """The requests of one keyed call, one per owner; ``wait()`` returns the call's result.

    Waiting is serialised (one thread collects; the others then read the kept outcome),
    so a refused part is handed over once.
    """

    def __init__(self, channel: Channel, batch: KeyedBatch,
                 parts: Sequence[tuple[slice | np.ndarray, Call | ShardRequest]],
                 finish: Callable[[list], object], *,
                 take_over: TakeOver | None = None) -> None:  # fmt: skip
        super().__init__(channel, [request for _, request in parts], finish)
        self.batch = batch
        self._positions = [positions for positions, _ in parts]
        self._take_over = take_over

    def _settle(self, timeout: float | None) -> None:
        with self._lock:
            if not self._done:
                self._keep(*self._collect(timeout))

    def _collect(self, timeout: float | None) -> tuple[object, BaseException | None]:
        channel = self._channel
        assert channel is not None, "a keyed call has a channel"
        limit = channel.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        got: list[Answered] = []
        refused: list[np.ndarray] = []
        take_over = self._take_over
        try:
            for positions, request in zip(self._positions, self._calls, strict=True):
                try:
                    got.append((positions, self._reply(channel, request, deadline, limit)))
                except RemoteError as exc:
                    if take_over is None or exc.remote_type != PLACEMENT_REFUSAL:
                        raise
                    refused.append(positions_of(positions))
            if refused:
                assert take_over is not None  # only a call that may take over keeps a refusal
                got += take_over(self.batch, np.concatenate(refused), limit)
            return self._finish(got), None
        except Exception as exc:
            return None, self._failed(channel, self._calls, exc)


def rows_of(count: int, inverse: np.ndarray | None) -> Callable[[list], np.ndarray]:
    """The ``finish`` of a pull: every owner's rows in grouped order, then the caller's
    (``inverse`` None: the grouped order is the caller's). Always a new, writable array:
    one owner's rows in the caller's order are the reply's own frame, handed over (the
    decoder marks reply buffers read-only; this call is the frame's only user, so it
    may be written), which saves a copy of every row (~40 µs per 512 KiB)."""

    def finish(got: list) -> np.ndarray:
        for positions, reply in got:  # a reply is remote input (its schema: 2-D float32)
            asked = len(range(count)[positions]) if isinstance(positions, slice) else len(positions)
            if reply.bufs[0].shape[0] != asked:
                raise ProtocolError(
                    f"a server answered {reply.bufs[0].shape[0]} rows for {asked} keys "
                    "(a server of another sparseps version?)"
                )
        if len(got) == 1 and got[0][0] == slice(0, count):
            rows = got[0][1].bufs[0]
            if inverse is not None:
                return np.take(rows, inverse, axis=0)
            try:
                rows.flags.writeable = True  # a received frame's memory is the receiver's
            except ValueError:  # a read-only buffer (not a received frame): copy it
                return rows.copy()
            return rows
        rows = np.empty((count, got[0][1].bufs[0].shape[1]), dtype=np.float32)
        for positions, reply in got:
            rows[positions] = reply.bufs[0]
        return rows if inverse is None else np.take(rows, inverse, axis=0)

    return finish
