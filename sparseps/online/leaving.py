"""A worker that dies mid-pass leaves the job: the others re-read its files and finish.

Applies to an online job in async mode with ``data.split: steal`` and ``data.lease_s``
(worker 0 then sets ``elastic/leave_on_death`` on the workers' store). The parts:

- **The launcher records the leave.** When such a job's worker ``r > 0`` exits with a
  non-zero code (SIGKILL, a crash), the supervisor neither fails the job nor restarts the
  workers: :meth:`sparseps.launch.scaling.ScaleService.worker_died` writes
  ``elastic/workers`` the way a scale request does, version + 1, with ``members`` (the
  launch ranks that remain) and ``left`` (every rank that died). Worker 0 hosts the store
  and writes the ledger, so its death still fails the job.
- **The survivors meet at a fence, not in a collective.** The pass's training data is
  wrapped (:class:`LeaveAware`): each batch it hands to the trainer adds its rows to
  ``.../pass/<seq>/rows/<rank>`` on the store, and the files the worker trains are listed
  in ``.../pass/<seq>/files/<rank>``. When a worker's data runs out, before the trainer's
  end-of-pass collectives, it arrives at a *fence* (``.../fence/<seq>/<n>/arrived/<rank>``).
  Worker 0 waits until every member has arrived or is named in the launcher's ``left``,
  bounded by ``job.collective_timeout_s`` (a member that neither arrives nor is recorded
  dead fails the pass with a :class:`~sparseps.errors.DeadlineError` naming it), and
  writes the fence's decision: who departed, who remains, each departed worker's files
  and rows. Nobody waits in a gloo collective on a dead peer.
- **Re-form, then re-read.** On a departure every survivor leaves its gloo group and forms
  one of the survivors (:meth:`Membership.regroup`, under the fence's own prefix). Ranks
  are *not* renumbered: processes keep their launch rank (logs, heartbeats, file owners),
  the group ranks them by their order among the members (:func:`rank_map`). The departed
  workers' files are split over the survivors by group rank (``files[i::n]``), read from
  their start and trained in the same pass; then the survivors meet at the next fence
  (another worker may die meanwhile). Only then does the trainer reduce the pass's
  metrics, over the survivors.
- **Rows are counted honestly.** A departed worker's rows are its files' (the pass
  shuffles each worker's own rows: no global shuffle with a lease), so re-reading its
  files trains each of them at least once. The ledger's record says who left
  (``left``: rank, files, rows it had taken), ``rows_reread`` (the rows the departed
  workers had taken for training before they died: trained again by the survivors, an
  upper bound of the duplicates since a few taken batches may not have been applied),
  and ``rows_trained`` = ``samples`` + ``rows_reread``; ``samples`` stays the rows the
  survivors trained (every row of the pass once).

Not covered: a death while a pass loads, evaluates or saves (outside training), or
after the fence (during the end-of-pass collectives): the survivors' collectives fail
and the job stops as before; a rerun resumes from the newest checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ..errors import DeadlineError
from ..store.worker_keys import FIXED_KEY, LEAVES_KEY
from .membership import PREFIX, Membership, requested_members

__all__ = [
    "FIXED_KEY",
    "LEAVES_KEY",
    "FenceDecision",
    "LeaveAware",
    "Fence",
    "rank_map",
    "share_of",
]

log = logging.getLogger(__name__)


def rank_map(members: Iterable[int]) -> dict[int, int]:
    """Launch rank -> gloo group rank: a member's place in the sorted members."""
    return {rank: i for i, rank in enumerate(sorted(members))}


def share_of(files: list[str], rank: int, members: Iterable[int]) -> list[str]:
    """The part of ``files`` (a departed worker's, sorted) that survivor ``rank`` re-reads:
    ``files[i::n]`` for its group rank ``i`` of ``n`` members."""
    ranks = rank_map(members)
    return sorted(files)[ranks[rank] :: len(ranks)]


@dataclass(frozen=True)
class FenceDecision:
    """Worker 0's verdict at one fence (JSON on the store).

    Fields:
        departed: launch ranks that died before the fence (empty: every member arrived).
        members: the launch ranks that go on (group order).
        files: each departed rank's files (to read again), by rank (JSON keys are str).
        rows: each departed rank's rows taken for training before it died.
    """

    departed: list[int]
    members: list[int]
    files: dict[str, list[str]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps(
            {"departed": self.departed, "members": self.members, "files": self.files,
             "rows": self.rows}, sort_keys=True,
        )  # fmt: skip

    @classmethod
    def loads(cls, raw: bytes | str) -> FenceDecision:
        return cls(**json.loads(raw))

    def lost_files(self) -> list[str]:
        return sorted({f for files in self.files.values() for f in files})


class Fence:
    """The survivors' meeting points of one pass (see the module docstring).

    Args:
        members: this worker's membership (its store, rank and members).
        seq: the pass.
        timeout_s: the longest worker 0 waits for a member that neither arrives nor is
            recorded dead, and a member waits for worker 0's decision.
        poll_s: how often they look.
    """

    def __init__(self, members: Membership, seq: int, *, timeout_s: float,
                 poll_s: float = 0.05) -> None:  # fmt: skip
        self.members, self.seq = members, seq
        self.store, self.rank = members.store, members.rank
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.rounds = 0
        self.departed: dict[int, dict] = {}  # rank -> {"files", "rows"}, this pass

    def _key(self, what: str) -> str:
        return f"{PREFIX}/pass/{self.seq}/{what}"

    def publish_files(self, files: list[str]) -> None:
        """The files this worker trains in the pass (re-read by others if it dies)."""
        self.store.set(self._key(f"files/{self.rank}"), json.dumps(sorted(files)))

    def count_rows(self, rows: int) -> None:
        self.store.add(self._key(f"rows/{self.rank}"), rows)

    def meet(self) -> FenceDecision:
        """Arrive at the next fence and return its decision (every member calls it)."""
        n, self.rounds = self.rounds, self.rounds + 1
        base = self._key(f"fence/{n}")
        self.store.set(f"{base}/arrived/{self.rank}", "1")
        if self.rank == 0:
            decision = self._decide(base)
            self.store.set(f"{base}/decision", decision.dumps())
        else:
            decision = FenceDecision.loads(
                self.members.written_by_worker_0(
                    f"{base}/decision", "worker 0's decision", op="fence", seconds=self.timeout_s
                )
            )
        for rank in decision.departed:
            self.departed[rank] = {"files": decision.files[str(rank)],
                                   "rows": decision.rows[str(rank)]}  # fmt: skip
        return decision

    def _decide(self, base: str) -> FenceDecision:
        members = self.members.members
        deadline = time.monotonic() + self.timeout_s
        arrived: set[int] = set()
        while True:
            for rank in members:
                if rank not in arrived and self.store.check([f"{base}/arrived/{rank}"]):
                    arrived.add(rank)
            waiting = [r for r in members if r not in arrived]
            if not waiting:
                return FenceDecision([], list(members))
            _, _, left = requested_members(self.store, self.members.version, members)
            if all(r in left for r in waiting):
                break
            if time.monotonic() > deadline:
                raise DeadlineError(
                    f"online pass seq {self.seq}: worker(s) {waiting} neither finished their "
                    f"data nor were reported dead within {self.timeout_s:.0f} s; see their "
                    "logs, or raise job.collective_timeout_s",
                    op="fence", role="worker", rank=waiting[0], seconds=self.timeout_s,
                    setting="job.collective_timeout_s",
                )  # fmt: skip
            time.sleep(self.poll_s)
        files, rows = {}, {}
        for rank in waiting:
            key = self._key(f"files/{rank}")
            files[str(rank)] = json.loads(self.store.get(key)) if self.store.check([key]) else []
            rows[str(rank)] = int(self.store.add(self._key(f"rows/{rank}"), 0))
        survivors = [r for r in members if r not in waiting]
        log.warning("online pass seq %d: worker(s) %s died mid-pass (rows taken: %s); "
                    "workers %s re-read their files %s", self.seq, waiting, rows, survivors,
                    files)  # fmt: skip
        return FenceDecision(waiting, survivors, files, rows)

    def regroup(self, decision: FenceDecision) -> None:
        """Form the survivors' gloo group (each fence that saw a departure has its own)."""
        self.members.regroup(
            tuple(decision.members), f"{PREFIX}/pass/{self.seq}/fence/{self.rounds - 1}/group"
        )

    def summary(self) -> dict:
        """What the ledger records of the departures (empty without any)."""
        if not self.departed:
            return {}
        left = [{"rank": r, **v} for r, v in sorted(self.departed.items())]
        return {"left": left, "rows_reread": sum(int(v["rows"]) for v in self.departed.values())}


class LeaveAware:
    """The pass's training data, with the fence at its end (see the module docstring).

    Args:
        dataset: this worker's data of the pass (its own files' rows).
        files: the files it holds.
        fence: the pass's :class:`Fence`.
        reread: reads files from their start: an iterable of batches.
    """

    def __init__(self, dataset, files: list[str], fence: Fence,
                 reread: Callable[[list[str]], Iterable]) -> None:  # fmt: skip
        self._dataset, self._files, self.fence, self._reread = dataset, list(files), fence, reread

    def __len__(self) -> int:
        return len(self._dataset)

    def __iter__(self) -> Iterator:
        fence = self.fence
        fence.publish_files(self._files)
        yield from self._counted(self._dataset)
        while True:
            decision = fence.meet()
            if not decision.departed:
                return
            fence.regroup(decision)
            mine = share_of(decision.lost_files(), fence.rank, decision.members)
            self._files += mine
            fence.publish_files(self._files)  # a survivor that dies too: its share as well
            log.warning("worker %d re-reads %d file(s) of departed worker(s) %s from their "
                        "start: %s", fence.rank, len(mine), decision.departed, mine)  # fmt: skip
            if mine:
                yield from self._counted(self._reread(mine))

    def _counted(self, batches: Iterable) -> Iterator:
        for batch in batches:
            self.fence.count_rows(len(batch))
            yield batch
