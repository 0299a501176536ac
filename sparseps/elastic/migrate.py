"""The migration driver: move virtual shards between running servers (issue 23).

:func:`migrate` takes a job from its current placement to a new one (normally from
:func:`~sparseps.core.placement.rebalance`) while clients keep pulling and pushing:

1. **create** every table on the servers that receive shards;
2. **begin**: each source remembers the keys pushed into its leaving shards (dirty keys);
3. **copy**: every row of the leaving shards (embedding, optimizer state, counters,
   pending admission counters) goes to its new owner; pushes keep landing at the source;
   then the rows pushed since the previous export, again and again (each export restarts
   the dirty set), until a round copies few rows (``settle_rows``) or ``max_rounds``;
4. **freeze**: each source refuses requests for its leaving shards (clients back off and
   resend) and answers once the pushes already past their check are applied;
5. **copy the dirty rows** again (the rows pushed since 2: now final);
6. **bump**: the new placement goes to the receivers first, then to every other server
   (sources last), so a client that learns the new version finds the new owners ready;
7. **drop** the moved rows at the sources.

Training waits only between 4 and 6 for the moving shards (the *cut-over*); the report
measures it. A push is applied once: at the source before the freeze (and then copied in
step 5), or refused and resent to the new owner after the bump.

Not handled yet: decay/shrink during a move (run them between moves), replicas, and
a driver that dies mid-move (the servers keep the old placement with shards frozen;
re-running the same migration completes it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import TableConfig
from ..core.placement import Placement, rebalance
from ..errors import InputError
from ..server.elastic_ops import PENDING_BUFS, ROW_BUFS
from .peers import Peers

__all__ = ["MigrationReport", "install_placement", "migrate", "scale"]


@dataclass(frozen=True)
class MigrationReport:
    """What one migration did and how long its phases took (seconds)."""

    version: int
    vshards_moved: int
    rows: int
    bytes: int
    copy_s: float
    cutover_s: float
    total_s: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.total_s if self.total_s else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.total_s if self.total_s else 0.0


def install_placement(peers: Peers, placement: Placement, order: Sequence[int] | None = None,
                      ranks: Sequence[int] | None = None) -> None:  # fmt: skip
    """Install ``placement`` on ``ranks`` (default: every server it names), ``order``
    first (each of those answers before the next is asked)."""
    ranks = list(range(len(placement.endpoints))) if ranks is None else sorted(set(ranks))
    if order is not None:
        ranks = [*order, *(r for r in ranks if r not in set(order))]
    args, owners = placement.to_wire()
    handles = []
    for rank in ranks:
        handles.append(
            peers.submit(placement.endpoints[rank], "set_placement", None, [owners], args)
        )
        if order is not None and rank in order:
            handles.pop().wait()  # the receivers hold it before anyone else does
    for handle in handles:
        handle.wait()


def _copy(peers: Peers, src: str, dst: str, table: str, vshards: np.ndarray, *, dirty: bool):
    result, bufs = peers.call(src, "move_export", table, [vshards], {"dirty": dirty})
    bufs = [np.ascontiguousarray(b) for b in bufs]
    names = [f"r_{n}" for n in ROW_BUFS] + [f"p_{n}" for n in PENDING_BUFS]
    if len(bufs) != len(names):
        raise InputError(f"migrate: move_export from {src} answered {len(bufs)} buffers, "
                         f"expected {len(names)} (servers of another version?)")  # fmt: skip
    if result["rows"] or result["pending"]:
        peers.call(dst, "move_import", table, bufs)
    return result["rows"] + result["pending"], sum(b.nbytes for b in bufs)


def migrate(peers: Peers, new: Placement, *, max_rounds: int = 4,
            settle_rows: int = 20_000) -> MigrationReport:  # fmt: skip
    """Move the job from the placement its servers hold to ``new`` (module docstring).

    Args:
        peers: connections to the servers.
        new: the next placement (version + 1).
        max_rounds: dirty copies before the freeze, at most.
        settle_rows: a dirty copy that moves fewer rows than this ends the pre-copy: the
            freeze then waits for about as many rows.

    Raises:
        InputError: ``new`` is not the next version of the servers' placement, or
            changes the number of virtual shards.
    """
    start = time.perf_counter()
    current, tables = peers.placement(new.endpoints[0])
    if current is None or new.version != current.version + 1:
        raise InputError(f"migrate: the servers hold placement version "
                         f"{None if current is None else current.version}; the new one must be the next "
                         f"(got {new.version})")  # fmt: skip
    moves = current.moves(new)
    receivers = sorted({dst for _, dst in moves})
    for dst in receivers:  # 1. create
        client = peers.client(new.endpoints[dst])
        for config in tables.values():
            client.create_table(TableConfig.from_dict(config))
        if peers.placement(new.endpoints[dst])[0] is None:  # a new server: the old placement
            install_placement(peers, Placement(current.version, new.endpoints, current.owners),
                              order=[dst], ranks=[dst])  # fmt: skip
    leaving: dict[int, np.ndarray] = {}
    for (src, _), vshards in moves.items():
        leaving[src] = np.union1d(leaving.get(src, np.empty(0, np.int64)), vshards)
    for src, vshards in leaving.items():  # 2. begin
        peers.call(current.endpoints[src], "move_begin", None, [vshards])
    rows = nbytes = 0
    for (src, dst), vshards in moves.items():  # 3. copy
        for table in tables:
            r, b = _copy(
                peers, current.endpoints[src], new.endpoints[dst], table, vshards, dirty=False
            )
            rows, nbytes = rows + r, nbytes + b
    for _ in range(max_rounds):  # 3b. pre-copy what was pushed meanwhile
        moved = 0
        for (src, dst), vshards in moves.items():
            for table in tables:
                r, b = _copy(peers, current.endpoints[src], new.endpoints[dst], table, vshards,
                             dirty=True)  # fmt: skip
                rows, nbytes, moved = rows + r, nbytes + b, moved + r
        if moved < settle_rows:
            break
    copied = time.perf_counter()
    for src, vshards in leaving.items():  # 4. freeze
        peers.call(current.endpoints[src], "move_freeze", None, [vshards])
    for (src, dst), vshards in moves.items():  # 5. dirty rows
        for table in tables:
            r, b = _copy(
                peers, current.endpoints[src], new.endpoints[dst], table, vshards, dirty=True
            )
            rows, nbytes = rows + r, nbytes + b
    # 6. bump, on the servers that own shards before or after (not on drained ones: they
    # may be stopped)
    install_placement(peers, new, order=receivers,
                      ranks=sorted({*current.live_ranks(), *new.live_ranks()}))  # fmt: skip
    cut = time.perf_counter()
    for src, vshards in leaving.items():  # 7. drop
        for table in tables:
            peers.call(current.endpoints[src], "move_drop", table, [vshards])
    end = time.perf_counter()
    return MigrationReport(new.version, int(sum(len(v) for v in moves.values())), rows, nbytes,
                           copied - start, cut - copied, end - start)  # fmt: skip


def scale(peers: Peers, endpoints: Sequence[str], ranks: Sequence[int],
          **options) -> MigrationReport:  # fmt: skip
    """Spread the virtual shards over ``ranks`` of ``endpoints`` (new servers already
    running at the added addresses); a rank left out is drained (it may be stopped after).
    ``options`` go to :func:`migrate`."""
    current = peers.newest(endpoints)
    if current is None:
        raise InputError(f"scale: the servers {list(endpoints)} hold no placement")
    return migrate(peers, rebalance(current, ranks, endpoints), **options)
