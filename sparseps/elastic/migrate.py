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

Every step can be repeated, so a driver that died mid-move is recovered by running the
same migration again (``migrate(peers, new)`` or :func:`scale` with the same ranks):

- before any server holds ``new``: the whole migration runs again. ``move_begin`` is an
  OR of masks; the destinations first drop what an interrupted copy left of their
  incoming shards (``move_begin(..., receive=1)``), then the full copy (an upsert from
  sources that are frozen or still serving) and the rest follow; a freeze repeats;
- once a server holds ``new`` (the bump reached the receivers: they may have applied
  pushes since, so nothing is copied again): ``new`` goes to every server that answers,
  then each drops the rows of shards it does not own (:func:`finish`).

Servers in a move refuse table-wide ops (decay, shrink, save, ...) until the bump; the
clients wait and send them again (:mod:`sparseps.elastic.server_moves`). Not handled:
replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..config import TableConfig
from ..core.placement import Placement, rebalance
from ..errors import InputError, SparsePSError, UnavailableError
from .peers import Peers

__all__ = ["STEPS", "MigrationReport", "finish", "install_placement", "migrate", "scale"]

# migrate's steps, in order: ``on_step(name)`` is called after each (tests stop the driver
# there to check that a re-run completes the move)
STEPS = ("create", "begin", "copy", "precopy", "freeze", "final_copy", "bump_receivers",
         "bump", "drop")  # fmt: skip
# how long a finishing driver waits for a server that may have been stopped after a drain
_FINISH_PROBE_S = 5.0


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
    peers.learn(placement.endpoints)
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
    # its buffers are move_import's, in order (the channel checked them against the schema)
    bufs = [np.ascontiguousarray(b) for b in bufs]
    if result["rows"] or result["pending"]:
        peers.call(dst, "move_import", table, bufs)
    return result["rows"] + result["pending"], sum(b.nbytes for b in bufs)


def finish(peers: Peers, new: Placement) -> int:
    """Complete a migration to ``new`` whose bump reached some servers: install ``new``
    on every server of it that answers, then each drops the rows of the shards it does
    not own. Returns the rows dropped. A server that does not answer within a few
    seconds (a drained one, stopped) is skipped."""
    peers.learn(new.endpoints)
    args, owners = new.to_wire()
    alive = []
    for rank, endpoint in enumerate(new.endpoints):
        try:
            peers.call(endpoint, "set_placement", None, [owners], args,
                       timeout=None if rank in new.live_ranks() else _FINISH_PROBE_S)  # fmt: skip
        except SparsePSError:
            if rank in new.live_ranks():
                raise
            continue
        alive.append(rank)
    return _drop_foreign(peers, new, alive)


def _drop_foreign(peers: Peers, placement: Placement, ranks) -> int:
    """Each server of ``ranks`` drops the rows of shards it does not own (rows a driver
    that died before its drop left behind)."""
    dropped = 0
    for rank in ranks:
        endpoint = placement.endpoints[rank]
        foreign = np.flatnonzero(placement.owners != rank)
        _, tables = peers.placement(endpoint)
        for table in tables:
            dropped += int(peers.call(endpoint, "move_drop", table, [foreign])[0]["rows"])
    return dropped


def migrate(peers: Peers, new: Placement, *, max_rounds: int = 4, settle_rows: int = 20_000,
            on_step: Callable[[str], None] | None = None) -> MigrationReport:  # fmt: skip
    """Move the job from the placement its servers hold to ``new`` (module docstring);
    run it again after a driver that died mid-move, and it completes that move.

    Args:
        peers: connections to the servers.
        new: the next placement (version + 1), or the one an interrupted migration was
            installing.
        max_rounds: dirty copies before the freeze, at most.
        settle_rows: a dirty copy that moves fewer rows than this ends the pre-copy: the
            freeze then waits for about as many rows.
        on_step: called with each name of :data:`STEPS` once that step is done.

    Raises:
        InputError: ``new`` is not the next version of the servers' placement (nor the
            one they are being moved to), or changes the number of virtual shards.
        UnavailableError: a server of the move died (its connection dropped): raised
            at once, naming its rank and address and the last step done.
    """
    done: list[str] = []

    def step(name: str) -> None:
        done.append(name)
        if on_step is not None:
            on_step(name)

    peers.learn(new.endpoints)  # errors name each server by its rank in the job
    try:
        return _migrate(peers, new, max_rounds=max_rounds, settle_rows=settle_rows, step=step)
    except UnavailableError as exc:
        after = f"after its step {done[-1]!r}" if done else "before its first step"
        raise UnavailableError(
            f"migration to placement version {new.version} stopped {after}: {exc}; the move "
            "is incomplete: run it again once that server runs again, or move to a placement "
            "without it (every step repeats; docs/elastic.md, 'A server that dies mid-move')",
            op=exc.op, role=exc.role, rank=exc.rank, address=exc.address,
        ) from exc  # fmt: skip


def _migrate(peers: Peers, new: Placement, *, max_rounds: int, settle_rows: int,
             step: Callable[[str], None]) -> MigrationReport:  # fmt: skip
    start = time.perf_counter()
    current, tables = peers.placement(new.endpoints[0])
    if current is not None and current.version == new.version:
        if not np.array_equal(current.owners, new.owners) or current.endpoints != new.endpoints:
            raise InputError(f"migrate: the servers hold placement version {new.version} "
                             "with other owners or endpoints than the new one")  # fmt: skip
        finish(peers, new)  # an interrupted migration's bump reached server 0: complete it
        end = time.perf_counter()
        return MigrationReport(new.version, 0, 0, 0, 0.0, 0.0, end - start)
    if current is None or new.version != current.version + 1:
        raise InputError(f"migrate: the servers hold placement version "
                         f"{None if current is None else current.version}; the new one must be the next "
                         f"(got {new.version})")  # fmt: skip
    moves = current.moves(new)
    receivers = sorted({dst for _, dst in moves})
    for dst in receivers:  # an interrupted migration whose bump reached receivers only
        held = peers.placement(new.endpoints[dst])[0]
        if held is not None and held.version == new.version:
            finish(peers, new)
            end = time.perf_counter()
            return MigrationReport(new.version, 0, 0, 0, 0.0, 0.0, end - start)
    for dst in receivers:  # 1. create
        for name, config in tables.items():
            config = TableConfig.from_dict(config).to_dict()
            peers.call(new.endpoints[dst], "create_table", name, (), {"config": config})
        if peers.placement(new.endpoints[dst])[0] is None:  # a new server: the old placement
            install_placement(peers, Placement(current.version, new.endpoints, current.owners),
                              order=[dst], ranks=[dst])  # fmt: skip
    step("create")
    leaving: dict[int, np.ndarray] = {}
    arriving: dict[int, np.ndarray] = {}
    for (src, dst), vshards in moves.items():
        leaving[src] = np.union1d(leaving.get(src, np.empty(0, np.int64)), vshards)
        arriving[dst] = np.union1d(arriving.get(dst, np.empty(0, np.int64)), vshards)
    for dst, vshards in arriving.items():  # 2. begin: receivers first (they drop leftovers)
        peers.call(new.endpoints[dst], "move_begin", None, [vshards], {"receive": 1})
    for src, vshards in leaving.items():
        peers.call(current.endpoints[src], "move_begin", None, [vshards])
    step("begin")
    rows = nbytes = 0
    for (src, dst), vshards in moves.items():  # 3. copy
        for table in tables:
            r, b = _copy(
                peers, current.endpoints[src], new.endpoints[dst], table, vshards, dirty=False
            )
            rows, nbytes = rows + r, nbytes + b
    step("copy")
    for _ in range(max_rounds):  # 3b. pre-copy what was pushed meanwhile
        moved = 0
        for (src, dst), vshards in moves.items():
            for table in tables:
                r, b = _copy(peers, current.endpoints[src], new.endpoints[dst], table, vshards,
                             dirty=True)  # fmt: skip
                rows, nbytes, moved = rows + r, nbytes + b, moved + r
        if moved < settle_rows:
            break
    step("precopy")
    copied = time.perf_counter()
    for src, vshards in leaving.items():  # 4. freeze
        peers.call(current.endpoints[src], "move_freeze", None, [vshards])
    step("freeze")
    for (src, dst), vshards in moves.items():  # 5. dirty rows
        for table in tables:
            r, b = _copy(
                peers, current.endpoints[src], new.endpoints[dst], table, vshards, dirty=True
            )
            rows, nbytes = rows + r, nbytes + b
    step("final_copy")
    # 6. bump, on the servers that own shards before or after (not on drained ones: they
    # may be stopped); the receivers first, one after the other
    install_placement(peers, new, order=receivers, ranks=receivers)
    step("bump_receivers")
    others = sorted({*current.live_ranks(), *new.live_ranks()} - set(receivers))
    install_placement(peers, new, ranks=others)
    cut = time.perf_counter()
    step("bump")
    for src, vshards in leaving.items():  # 7. drop
        for table in tables:
            peers.call(current.endpoints[src], "move_drop", table, [vshards])
    if not moves:  # nothing moved (a re-run?): rows a driver that died before its drop
        finish(peers, new)  # left, also on drained servers (a stopped one costs seconds)
    step("drop")
    end = time.perf_counter()
    return MigrationReport(new.version, int(sum(len(v) for v in moves.values())), rows, nbytes,
                           copied - start, cut - copied, end - start)  # fmt: skip


def scale(peers: Peers, endpoints: Sequence[str], ranks: Sequence[int],
          **options) -> MigrationReport:  # fmt: skip
    """Spread the virtual shards over ``ranks`` of ``endpoints`` (new servers already
    running at the added addresses); a rank left out is drained (it may be stopped after).
    ``options`` go to :func:`migrate`."""
    peers.learn(endpoints)
    current = peers.newest(endpoints)
    if current is None:
        raise InputError(f"scale: the servers {list(endpoints)} hold no placement")
    if _bumped_partly(peers, current):  # a migration's bump was cut short: complete it
        finish(peers, current)
    return migrate(peers, rebalance(current, ranks, endpoints), **options)


def _bumped_partly(peers: Peers, newest: Placement) -> bool:
    """Whether server 0 or a live server of ``newest`` still holds an older version (an
    interrupted bump that reached the receivers, not every server)."""
    for rank in sorted({0, *newest.live_ranks()}):
        held = peers.placement(newest.endpoints[rank])[0]
        if held is None or held.version != newest.version:
            return True
    return False
