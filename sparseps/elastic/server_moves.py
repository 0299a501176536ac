"""The server side of an elastic job: ``ElasticMoves``, a server's placement and the live
migration ops (issue 23), a part of :class:`~sparseps.server.handlers.ServerState` (whose
op table maps the ops below to it).

A server with a placement (:mod:`sparseps.core.placement`) checks each key's virtual
shard against it instead of ``server_of(key, S)``, and refuses keys of shards it does not
own, or is handing over, with :class:`~sparseps.core.placement.PlacementError` (the
client refreshes its placement and resends; nothing of the refused request is applied).

The ops, in the order the migration driver (:mod:`sparseps.elastic.migrate`) sends them:

- ``get_placement`` / ``set_placement``: read / install (only a newer version replaces
  the current one; installing one ends any hand-over this server was in).
- ``move_begin(vshards)``: from now on, remember the keys pushed into these shards
  (the *dirty* keys), per table. ``move_begin(vshards, receive=1)`` (sent to a
  destination before any row is copied): rows of these shards left over from an
  interrupted move are dropped, and the server is *receiving* until the bump.
- ``move_export(table, vshards, dirty)``: the rows (embedding, optimizer state and
  counters) and the pending admission counters of the shards' keys, all of them or only
  the dirty ones; the dirty keys of these shards restart from the export's snapshot (the
  driver repeats dirty exports until few keys are dirty, then freezes).
- ``move_freeze(vshards)``: refuse requests for these shards from now on; answers once
  every push and pull that was already past its check is done.
- ``move_import(table, columns)``: upsert exported rows (no routing check: the shards are
  not this server's until the placement that gives them to it is installed).
- ``move_drop(table, vshards)``: delete the rows of shards this server no longer owns.

Every keyed op checks its keys *inside* the table's lock (pushes and writes the write
lock, pulls the read lock), so a freeze orders them: each push is either applied before
the final (dirty) export or refused and resent to the new owner, never both, never
neither; and no pull that passed its check reads a row after the source dropped it (it
would read a fresh row's value). The check reads the move's state as one snapshot
(:class:`MoveState`, replaced whole): a bump that lands mid-check cannot pair the old
placement with the new state's "nothing frozen".

A server in a move (a source from ``move_begin``, a destination from ``move_begin(...,
receive=1)``, until ``set_placement`` installs a newer version) refuses the table-wide
ops that read or rewrite every row (decay, shrink, save, load, save_inference,
commit_inference) with :class:`MoveInProgressError`, checked inside the table's lock
(:meth:`ElasticMoves.refuse_during_move`, called by those ops' parts); the client waits
for the move to end and sends them again (:mod:`sparseps.elastic.routing`). A save, an
inference save and a shrink's answer keep only the rows of shards the server owns (a
source still holds the moved rows between the bump and ``move_drop``;
:class:`~sparseps.server.ownership.KeyOwnership`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..core.placement import Placement, PlacementError, vshards_of
from ..errors import InputError
from ..rpc.ops import UPDATE_OPS
from ..table.columns import (
    OPTIONAL_PENDING_COLUMNS,
    OPTIONAL_ROW_COLUMNS,
    PENDING_COLUMNS,
    ROW_COLUMNS,
)

if TYPE_CHECKING:
    from ..rpc.protocol import Request
    from ..table import SparseTable

Answer = tuple[object, "list[np.ndarray]"]  # an op's (value, arrays): the server's Answer


class _Lock(Protocol):
    def read(self) -> AbstractContextManager[object]: ...
    def write(self) -> AbstractContextManager[object]: ...


class _Entry(Protocol):
    @property
    def table(self) -> SparseTable: ...
    @property
    def lock(self) -> _Lock: ...


class _Tables(Protocol):
    """What the moves need of the server's sparse tables
    (:class:`sparseps.server.entries.Tables`, which this layer may not import)."""

    def items(self) -> Iterable[tuple[str, _Entry]]: ...
    def entry(self, request: Request) -> _Entry: ...


__all__ = ["ROW_BUFS", "PENDING_BUFS", "ElasticMoves", "MoveInProgressError", "MoveState"]

# move_export's reply buffers and move_import's request buffers (r_/p_ prefixed), in order:
# the table's export columns (their dtypes are listed in rpc/ops.py)
ROW_BUFS = (*ROW_COLUMNS, *OPTIONAL_ROW_COLUMNS)
PENDING_BUFS = (*PENDING_COLUMNS, *OPTIONAL_PENDING_COLUMNS)


class MoveInProgressError(InputError):
    """A table-wide op reached a server while it hands over or receives virtual shards:
    nothing was applied; send it again once the move ended (PSClient does)."""


@dataclass(frozen=True)
class MoveState:
    """A server's placement and the move it is in, read and replaced as one value.

    Attributes:
        placement: the installed placement (None: not an elastic job).
        frozen: bool ``[V]``, shards refused while handed over (None: none).
        moving: bool ``[V]``, shards whose pushed keys are remembered (None: none).
        receiving: bool ``[V]``, shards whose rows arrive here (None: none).
    """

    placement: Placement | None = None
    frozen: np.ndarray | None = None
    moving: np.ndarray | None = None
    receiving: np.ndarray | None = None

    @property
    def in_move(self) -> bool:
        return self.placement is not None and (
            self.moving is not None or self.receiving is not None or self.frozen is not None
        )


def _union(mask: np.ndarray | None, more: np.ndarray) -> np.ndarray:
    return more if mask is None else (mask | more)


class ElasticMoves:
    """The placement a server holds (none until an elastic job installs one), the state of
    a move it is in, and the ops that install placements and move virtual shards.

    Args:
        rank: the server's rank.
        replicas: the job's backup copies per shard (placements do not support them yet).
        tables: the server's sparse tables (the rows that move).
    """

    def __init__(self, rank: int, replicas: int, tables: _Tables) -> None:
        self.rank = rank
        self.replicas = replicas
        self.tables = tables
        self._lock = threading.Lock()  # held to replace the state and for the dirty keys
        self._state = MoveState()
        self._dirty: dict[str, list[np.ndarray]] = {}

    @property
    def placement(self) -> Placement | None:
        """The installed placement; None: not an elastic job (keys route by formula)."""
        return self._state.placement

    @property
    def state(self) -> MoveState:
        """The placement and the move, as one snapshot."""
        return self._state

    def install(self, new: Placement) -> tuple[int, bool]:
        """Install ``new`` unless this server holds a newer (or the same) version; ends any
        move this server was in. Returns ``(the version held now, installed)``.

        Raises:
            InputError: ``new`` has another number of virtual shards than the job's.
        """
        if self._state.placement is None:
            # The check's hash kernel, compiled (a cold kernel cache) or loaded here,
            # before any request is checked against a placement, and not by the job's
            # first placed pulls, which waited 1-2 s for it at a first scale.
            vshards_of(np.zeros(1, np.uint64), new.vshards)
        with self._lock:
            current = self._state.placement
            if current is not None:
                if new.vshards != current.vshards:
                    raise InputError(
                        f"server {self.rank}: placement version {new.version} has {new.vshards} "
                        f"virtual shards, the job has {current.vshards} (fixed per job)"
                    )
                if new.version <= current.version:
                    return current.version, False
            self._state = MoveState(new)
            self._dirty = {}
        return new.version, True

    # -- the check every keyed op makes under a placement -------------------------------
    def check_placed(self, request: Request, keys: np.ndarray) -> None:
        """Refuse keys of shards this server does not own or hands over
        (:class:`PlacementError`: the client refreshes and resends); remember the updated
        keys of moving shards (the dirty keys)."""
        state = self._state  # one snapshot: a bump may land meanwhile
        placement, frozen, moving = state.placement, state.frozen, state.moving
        assert placement is not None  # called only with one installed
        if not len(keys):
            return
        vs = vshards_of(keys, placement.vshards)
        refused = placement.owners[vs] != self.rank
        if frozen is not None:
            refused |= frozen[vs]
        if refused.any():
            first = int(np.argmax(refused))
            raise PlacementError(
                f"server {self.rank}: {int(refused.sum())} of {len(keys)} keys of {request.op} "
                f"{request.table!r} are in virtual shards it does not own at placement version "
                f"{placement.version} (first key {int(keys[first])}, virtual shard {int(vs[first])}"
                f"{', being handed over' if frozen is not None and frozen[vs[first]] else ''}); "
                "refresh the placement and resend"
            )
        if moving is not None and request.op in UPDATE_OPS:
            mask = moving[vs]
            if mask.any():
                with self._lock:
                    self._dirty.setdefault(str(request.table), []).append(keys[mask].copy())

    # -- placement --------------------------------------------------------------------
    def get_placement(self, request: Request) -> Answer:
        tables = {name: entry.table.config.to_dict() for name, entry in self.tables.items()}
        placement = self._state.placement
        if placement is None:
            return {"version": 0, "tables": tables}, []
        args, owners = placement.to_wire()
        return {**args, "tables": tables}, [owners]

    def set_placement(self, request: Request) -> Answer:
        if self.replicas:
            raise InputError(
                f"server {self.rank}: placements (elastic jobs) do not support replicas yet"
            )
        version, installed = self.install(Placement.from_wire(request.args, request.bufs["owners"]))
        return {"version": version, "installed": installed}, []

    def _vshard_mask(self, request: Request) -> np.ndarray:
        placement = self._state.placement
        if placement is None:
            raise InputError(
                f"server {self.rank}: {request.op} needs a placement (set_placement first)"
            )
        vshards = request.bufs["vshards"]
        if len(vshards) and (vshards.min() < 0 or vshards.max() >= placement.vshards):
            raise InputError(
                f"server {self.rank}: {request.op}: virtual shards must be in 0..{placement.vshards - 1}"
            )
        mask = np.zeros(placement.vshards, bool)
        mask[vshards] = True
        return mask

    def move_begin(self, request: Request) -> Answer:
        mask = self._vshard_mask(request)
        if not request.args.get("receive"):
            with self._lock:
                self._state = replace(self._state, moving=_union(self._state.moving, mask))
            return None, []
        self._refuse_owned(request, mask)
        with self._lock:
            self._state = replace(self._state, receiving=_union(self._state.receiving, mask))
        dropped = 0  # rows an interrupted move left here: the copy starts from nothing
        for _, entry in self.tables.items():
            with entry.lock.write():
                dropped += self._drop_rows(entry.table, mask)
        return {"rows": dropped}, []

    # -- table-wide ops during a move --------------------------------------------------
    def refuse_during_move(self, request: Request) -> None:
        """Raise :class:`MoveInProgressError` while this server is in a move (the caller
        holds the table's lock: a copy then sees the op's effect, or the op waits)."""
        state = self._state
        placement = state.placement
        if state.in_move:
            role = "receives" if state.receiving is not None else "hands over"
            raise MoveInProgressError(
                f"server {self.rank}: {request.op} {request.table!r} refused: this server "
                f"{role} virtual shards (a migration to placement version "
                f"{placement.version + 1 if placement else '?'} runs); "
                "send it again once the migration ended"
            )
        sent = request.args.get("placement_version")
        if sent is not None and placement is not None and sent != placement.version:
            # the sender's placement is not this server's (a bump just landed here or is
            # about to): applied now, the client could not tell which shards it reached
            raise MoveInProgressError(
                f"server {self.rank}: {request.op} {request.table!r} refused: sent for "
                f"placement version {sent}, this server has version {placement.version}; "
                "send it again with the newest placement"
            )

    def owned_mask(self, keys: np.ndarray) -> np.ndarray | None:
        """Which of ``keys`` this server owns under its placement (None: no placement)."""
        placement = self._state.placement
        if placement is None:
            return None
        return placement.owner_of(keys) == self.rank if len(keys) else np.zeros(0, bool)

    def move_freeze(self, request: Request) -> Answer:
        mask = self._vshard_mask(request)
        with self._lock:
            self._state = replace(self._state, frozen=_union(self._state.frozen, mask))
        for _, entry in self.tables.items():  # wait out pushes and pulls past the check
            with entry.lock.write():
                pass
        return None, []

    # -- rows -------------------------------------------------------------------------
    def _take_dirty(self, table: str, mask: np.ndarray) -> np.ndarray:
        """The dirty keys of ``table`` in the shards of ``mask``, forgotten (the caller
        holds the table's lock, so no push records one meanwhile)."""
        with self._lock:
            parts = self._dirty.pop(table, [])
            keys = np.concatenate(parts) if parts else np.empty(0, np.uint64)
            inside = mask[vshards_of(keys, len(mask))] if len(keys) else np.zeros(0, bool)
            if not inside.all():
                self._dirty[table] = [keys[~inside]]  # other destinations' shards
        return np.unique(keys[inside])

    def move_export(self, request: Request) -> Answer:
        """All rows of the shards (``dirty`` 0), or those pushed since the last export of
        these shards (``dirty`` 1); either way the dirty keys restart from this snapshot."""
        entry = self.tables.entry(request)
        mask = self._vshard_mask(request)
        table = entry.table
        with entry.lock.read():
            if request.args["dirty"]:
                keys = self._take_dirty(str(request.table), mask)
            else:
                self._take_dirty(str(request.table), mask)
                keys = np.concatenate([table.keys(), table.export_pending()["key"]])
                keys = keys[mask[vshards_of(keys, len(mask))]] if len(keys) else keys
            rows, pending = table.export_keys(keys)
        out = [np.ascontiguousarray(rows[name]) for name in ROW_BUFS]
        out += [np.ascontiguousarray(pending[name]) for name in PENDING_BUFS]
        return {"rows": len(rows["key"]), "pending": len(pending["key"])}, out

    def move_import(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        bufs = request.bufs
        rows = {name: bufs[f"r_{name}"] for name in ROW_BUFS}
        pending = {name: bufs[f"p_{name}"] for name in PENDING_BUFS}
        with entry.lock.write():
            if len(rows["key"]):
                entry.table.import_rows(rows)
            if len(pending["key"]):
                entry.table.import_pending(pending)
        return {"rows": len(rows["key"]), "pending": len(pending["key"])}, []

    def move_drop(self, request: Request) -> Answer:
        entry = self.tables.entry(request)
        mask = self._vshard_mask(request)
        self._refuse_owned(request, mask)
        with entry.lock.write():
            dropped = self._drop_rows(entry.table, mask)
        return {"rows": dropped}, []

    def _refuse_owned(self, request: Request, mask: np.ndarray) -> None:
        placement = self._state.placement
        assert placement is not None  # _vshard_mask checked it
        owned = mask & (placement.owners == self.rank)
        if owned.any():
            raise InputError(
                f"server {self.rank}: {request.op} {request.table or ''!r}: virtual shard "
                f"{int(np.argmax(owned))} is still this server's at version {placement.version}"
            )

    @staticmethod
    def _drop_rows(table: SparseTable, mask: np.ndarray) -> int:
        """Delete the rows and pending counters of the shards of ``mask`` (write lock held)."""
        keys = np.concatenate([table.keys(), table.export_pending()["key"]])
        gone = keys[mask[vshards_of(keys, len(mask))]] if len(keys) else keys
        return table.drop(np.ascontiguousarray(gone))
