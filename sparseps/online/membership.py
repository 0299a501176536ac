"""Which workers train each pass of an online job: membership agreed at pass boundaries.

The launcher's contract (``sparseps scale LOG_DIR --workers N``, docs/elastic.md): the
workers' rendezvous store holds ``elastic/workers`` = ``{"version": v, "world": n}``
(absent: the launch's worker count); a scale writes it with ``v + 1`` and starts a worker
process for each new rank ``r`` in ``[old, n)`` whose ``SPARSEPS_WORKER_NUM`` is ``n``.
The launcher accepts ``--workers`` only once ``elastic/accepts_workers`` exists, which
worker 0 sets when its job can follow membership changes (async mode).

Why worker 0 decides and the others read: every member must use the same world for a
pass, and the request may change at any moment. At each pass boundary worker 0 alone
reads ``elastic/workers`` once and writes the *decision* for boundary ``k``
(``sparseps/online/members/decision/<k>``: version, world, the previous world, their
launch ranks when they are not ``0..world-1``, and the driver state a newcomer needs), then ``.../latest = k``; every member reads decision
``k`` (members count boundaries in lockstep). When the version changed, every member
leaves the gloo group, those with ``rank < world`` form a new one on the store under
``.../group/<version>`` (a fresh prefix, so no key of an old group is reused) and the
others leave the job (exit 0). A newcomer (started mid-pass, rank beyond the running
group) polls ``.../latest``. It joins at a decision whose new ranks include its own
(in the decision's ranks, not in the previous pass's), taking the slot ``.../joined/<k>/<rank>`` with an atomic
``add`` (a second process of the same rank finds it taken and waits). It leaves (exit 0)
at a decision made after it started that does not include it: scaled down again before
it joined, or its rank still held by a running member (a scale down and up within one
pass: the running process keeps the rank), and at the job's ``end`` decision. A decision
that existed when it started may predate its scale (the launcher writes the request,
then starts the process), so only its admission counts. Members block in the new
group's rendezvous until the newcomers arrive, so a newcomer only needs the latest
decision; a newcomer that never comes fails the members' rendezvous after
``job.collective_timeout_s``.

A worker that dies mid-pass (async, ``data.split: steal`` and ``data.lease_s``) leaves:
the launcher adds ``members`` (the launch ranks that remain) and ``left`` (the dead ones)
to ``elastic/workers``, and the group ranks the members by their sorted launch ranks
(:attr:`Membership.group_rank`); the pass's survivors re-form at once
(:meth:`Membership.regroup`, :mod:`sparseps.online.leaving`).

Collectives count the group's members, so barriers, metric all-reduces and the global
shuffle of a pass use the pass's world. Before the role layer's own gloo set-up, a
newcomer is detected (:func:`is_newcomer`) and given a group of one, so that
``sps.init()`` does not try to join a group of ``n`` that nobody else forms.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import DeadlineError
from ..runtime.worker_group import WorkerGroup
from ..store.worker_keys import ACCEPTS_WORKERS_KEY, LEAVES_KEY, MEMBERS_PREFIX, WORKERS_KEY

__all__ = [
    "ACCEPTS_KEY",
    "ELASTIC_KEY",
    "Decision",
    "Membership",
    "is_newcomer",
    "requested_workers",
]

log = logging.getLogger(__name__)

ELASTIC_KEY = WORKERS_KEY  # written by the launcher (sparseps scale --workers)
ACCEPTS_KEY = ACCEPTS_WORKERS_KEY  # written by worker 0 of a job that can follow
PREFIX = MEMBERS_PREFIX
MAX_WORKERS = 64  # as job.worker_num


@dataclass(frozen=True)
class Decision:
    """Worker 0's decision at one pass boundary (JSON on the store).

    Fields:
        boundary: the boundary's number (1 after the first pass of this run, ...).
        version: the membership version the next pass runs with.
        world: how many workers train the next pass (ranks ``0..world-1``).
        previous: the world of the pass before the boundary.
        state: what a newcomer needs of the driver (last seq, passes, has_base, ...).
        end: the job has no pass left (waiting newcomers exit).
        members: the launch ranks that train the next pass, when they are not
            ``0..world-1`` (a worker died and left: :mod:`sparseps.online.leaving`); the
            gloo group ranks them in this order.
        previous_members: the launch ranks of the pass before, when they are not
            ``0..previous-1``; a newcomer joins when its rank is in :attr:`ranks` and not
            in :attr:`previous_ranks`.
    """

    boundary: int
    version: int
    world: int
    previous: int
    state: dict[str, Any] = field(default_factory=dict)
    end: bool = False
    members: list[int] | None = None
    previous_members: list[int] | None = None

    @property
    def ranks(self) -> tuple[int, ...]:
        """The launch ranks of the next pass's workers, in group-rank order."""
        return tuple(range(self.world)) if self.members is None else tuple(self.members)

    @property
    def previous_ranks(self) -> tuple[int, ...]:
        """The launch ranks of the pass before the boundary."""
        listed = self.previous_members
        return tuple(range(self.previous)) if listed is None else tuple(listed)

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, raw: bytes | str) -> Decision:
        return cls(**json.loads(raw))


def requested_workers(store, default: tuple[int, int]) -> tuple[int, int]:
    """``(version, world)`` of ``elastic/workers``, or ``default`` when absent or malformed
    (a malformed value is logged and ignored: the job keeps its workers)."""
    version, members, _ = requested_members(store, default[0], tuple(range(default[1])))
    return version, len(members)


def requested_members(store, version: int, members: tuple[int, ...]
                      ) -> tuple[int, tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """``(version, members, left)`` of ``elastic/workers``: the launch ranks that should
    train (its ``members`` list, else ``0..world-1``) and the ranks whose process died and
    left (``left``, written by the launcher: :mod:`sparseps.online.leaving`). The given
    ``version`` and ``members`` when the key is absent or malformed (logged, ignored)."""
    default = (version, tuple(members), ())
    if not store.check([ELASTIC_KEY]):
        return default
    raw = store.get(ELASTIC_KEY)
    try:
        value = json.loads(raw)
        got, world = value["version"], value["world"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (got, world)):
            raise TypeError("version and world must be integers")
        if got < 0 or not 1 <= world <= MAX_WORKERS:
            raise ValueError(f"version >= 0 and 1 <= world <= {MAX_WORKERS}")
        listed = value.get("members")
        ranks = tuple(range(world)) if listed is None else tuple(sorted(int(r) for r in listed))
        if len(set(ranks)) != world or min(ranks) < 0:
            raise ValueError(f"members {listed!r} do not name {world} distinct ranks")
        left = tuple(sorted(int(r) for r in value.get("left", [])))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("%s holds %r (%s); ignored, the workers stay as they are", ELASTIC_KEY, raw, exc)
        return default
    return got, ranks, left


def _published(store) -> tuple[int, tuple[int, ...]] | None:
    """``(version, members)`` of the running group, as worker 0 last published it."""
    key = f"{PREFIX}/current"
    if not store.check([key]):
        return None
    value = json.loads(store.get(key))
    members = value.get("members")
    ranks = tuple(range(int(value["world"]))) if members is None else tuple(members)
    return int(value["version"]), ranks


def is_newcomer(env, *, timeout_s: float) -> bool:
    """Whether this worker was started for a scale-up of a running online job: its rank
    is beyond the group worker 0 published. Asked before ``sps.init()`` (which would
    otherwise wait for a gloo group of ``SPARSEPS_WORKER_NUM`` workers that nobody forms);
    worker 0 never is one."""
    if env.rank == 0 or env.local:
        return False
    from ..env import RENDEZVOUS_TIMEOUT
    from ..runtime.rendezvous import connect_store

    store = connect_store(env, timeout_s=timeout_s, setting=RENDEZVOUS_TIMEOUT)
    try:
        current = _published(store)
    finally:
        store.close()
    return current is not None and env.rank not in current[1]


def single_group() -> None:
    """A group of one (this process), so that ``sps.init()`` keeps it instead of joining
    the launch's group; :meth:`Membership.join` replaces it."""
    WorkerGroup(timeout_s=60.0).form_alone()


class Membership:
    """The membership of one worker of an online job, boundary after boundary.

    Args:
        store: the workers' rendezvous store.
        rank: this worker.
        version, world: the running group's membership (at the job's start: 0 and the
            launch's worker count).
        collective_timeout_s: the timeout of the groups it forms (``job.collective_timeout_s``).
        wait_s: how long a newcomer waits for a boundary that admits it, and a member for
            worker 0's decision.
        poll_s: how often a newcomer looks for a new decision.
    """

    def __init__(self, store, rank: int, *, version: int, world: int,
                 collective_timeout_s: float, wait_s: float, poll_s: float = 0.05) -> None:  # fmt: skip
        self.store, self.rank = store, rank
        self.version, self.world = version, world
        self._listed: tuple[int, ...] | None = None  # members when not 0..world-1
        self.boundary = 0
        self.collective_timeout_s, self.wait_s, self.poll_s = collective_timeout_s, wait_s, poll_s
        self.group = WorkerGroup(timeout_s=collective_timeout_s)

    @property
    def members(self) -> tuple[int, ...]:
        """The launch ranks of the running group, in group-rank order: ``0..world-1``
        until a worker died and left (:mod:`sparseps.online.leaving`)."""
        listed = self._listed
        return (
            listed if listed is not None and len(listed) == self.world else tuple(range(self.world))
        )

    @members.setter
    def members(self, ranks: tuple[int, ...]) -> None:
        ranks = tuple(sorted(ranks))
        self.world = len(ranks)
        self._listed = None if ranks == tuple(range(len(ranks))) else ranks

    @property
    def group_rank(self) -> int:
        """This worker's rank in the running gloo group (its launch rank until a worker
        left: then its place among the members)."""
        return self.members.index(self.rank)

    def start(self, *, leaves: bool = False) -> None:
        """Worker 0, at the job's start: publish the group and accept worker scaling;
        ``leaves``: a worker's death is a leave (``elastic/leave_on_death``, read by the
        launcher: :mod:`sparseps.online.leaving`)."""
        if self.rank == 0:
            self._publish()
            self.store.set(ACCEPTS_KEY, "1")
            if leaves:
                self.store.set(LEAVES_KEY, "1")

    def _publish(self) -> None:
        value: dict[str, Any] = {"version": self.version, "world": self.world}
        if self.members != tuple(range(self.world)):
            value["members"] = list(self.members)
        self.store.set(f"{PREFIX}/current", json.dumps(value))

    # -- members ------------------------------------------------------------------------

    def decide(self, state: dict[str, Any]) -> Decision:
        """The decision of the next boundary (worker 0 makes it, every member reads it)."""
        k = self.boundary + 1
        key = f"{PREFIX}/decision/{k}"
        if self.rank == 0:
            version, members, _ = requested_members(self.store, self.version, self.members)
            if version <= self.version:  # nothing new (or an older request): keep the group
                version, members = self.version, self.members
            world = len(members)
            listed = None if members == tuple(range(world)) else list(members)
            before = self.members
            previous = None if before == tuple(range(len(before))) else list(before)
            decision = Decision(k, version, world, len(before), state, members=listed,
                                previous_members=previous)  # fmt: skip
            self.store.set(key, decision.dumps())
            self.store.set(f"{PREFIX}/latest", str(k))
            if version != self.version:
                log.info("pass boundary %d: workers %d -> %d (membership version %d)",
                         k, self.world, world, version)  # fmt: skip
            return decision
        return Decision.loads(self._get(key))

    def apply(self, decision: Decision) -> bool:
        """Follow ``decision``: re-form the group when its version changed. Returns
        whether this worker trains the next pass (False: it leaves the job)."""
        self.boundary = decision.boundary
        if decision.version == self.version:
            return True
        self._leave_group()
        self.version, self.world = decision.version, decision.world
        self.members = decision.ranks
        if self.rank not in self.members:
            log.info("worker %d leaves the job at boundary %d (workers now %d)",
                     self.rank, decision.boundary, decision.world)  # fmt: skip
            return False
        self._form_group()
        if self.rank == 0:
            self._publish()
        return True

    def end(self, state: dict[str, Any]) -> None:
        """After the last pass (its ledger barrier was the last collective): worker 0 tells
        newcomers still waiting to exit. A member that joined later leaves its group now:
        worker 0 closes the store once the launch's workers stopped, and a gloo group
        over a closed store must not outlive it to the interpreter's exit."""
        if self.rank == 0:
            k = self.boundary + 1
            decision = Decision(k, self.version, self.world, self.world, state, end=True)
            self.store.set(f"{PREFIX}/decision/{k}", decision.dumps())
            self.store.set(f"{PREFIX}/latest", str(k))
            # workers that died and left (sparseps.online.leaving) never reach the exit
            # barrier worker 0 waits on before it closes the store (sparseps.role): their
            # leave stands for it
            for rank in requested_members(self.store, self.version, self.members)[2]:
                self.store.set(f"sparseps/exit/{rank}", "1")
        elif self.version > 0 or self.members != tuple(range(len(self.members))):
            self._leave_group()

    # -- newcomers ----------------------------------------------------------------------

    def join(self) -> Decision | None:
        """A newcomer: wait for the boundary that admits it, then join the group there.
        Returns the decision it joined at, or None when it is not needed (exit 0)."""
        first = self._latest()  # may predate this worker's scale (the launcher writes first)
        deadline = time.monotonic() + self.wait_s
        seen = -1
        while True:
            latest = self._latest()
            if latest > seen and latest > 0:
                seen = latest
                decision = Decision.loads(self.store.get(f"{PREFIX}/decision/{latest}"))
                verdict = self._verdict(decision, fresh=latest > first)
                if verdict is not None:
                    if not verdict:
                        return None
                    self.boundary = decision.boundary
                    self.version, self.world = decision.version, decision.world
                    self.members = decision.ranks
                    return decision
            if time.monotonic() > deadline:
                raise DeadlineError(
                    f"online worker {self.rank}: no pass boundary admitted it within "
                    f"{self.wait_s:.0f} s (a pass takes longer, or worker 0 is gone); raise "
                    "data.wait_timeout_s / job.collective_timeout_s",
                    op="join", role="worker", rank=self.rank, seconds=self.wait_s,
                    setting="data.wait_timeout_s / job.collective_timeout_s",
                )  # fmt: skip
            time.sleep(self.poll_s)

    def _verdict(self, decision: Decision, *, fresh: bool) -> bool | None:
        """True: join at ``decision``; False: exit; None: not this one, keep waiting.

        ``fresh``: the decision was made after this worker started, so after the scale
        that started it; an older one may be a boundary of an earlier membership.
        """
        if decision.end:
            log.info("worker %d: the job ended before it could join", self.rank)
            return False
        if self.rank in decision.ranks and self.rank not in decision.previous_ranks:
            # the members wait for this rank; one process takes it (an older process of
            # the same rank may have taken this slot already: then wait for a newer one)
            slot = f"{PREFIX}/joined/{decision.boundary}/{self.rank}"
            return True if int(self.store.add(slot, 1)) == 1 else None
        if not fresh:
            return None
        if self.rank not in decision.ranks:
            log.info("worker %d: scaled down to %d workers before it joined; leaving",
                     self.rank, decision.world)  # fmt: skip
        else:
            log.info("worker %d: rank %d is held by a running worker; leaving",
                     self.rank, self.rank)  # fmt: skip
        return False

    def form(self) -> None:
        """A newcomer admitted by :meth:`join`: leave its group of one, join the job's."""
        self._leave_group()
        self._form_group()

    def _latest(self) -> int:
        key = f"{PREFIX}/latest"
        return int(self.store.get(key)) if self.store.check([key]) else 0

    def _get(self, key: str) -> bytes:
        return self.written_by_worker_0(key, "worker 0's membership decision",
                                        op="membership", seconds=self.wait_s)  # fmt: skip

    def written_by_worker_0(self, key: str, what: str, *, op: str, seconds: float) -> bytes:
        """The value of ``key`` once worker 0 wrote it, polled for up to ``seconds``
        (then a DeadlineError naming ``what`` and ``job.collective_timeout_s``)."""
        deadline = time.monotonic() + seconds
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                raise DeadlineError(
                    f"online worker {self.rank}: {what} ({key}) did not come within "
                    f"{seconds:.0f} s; check worker 0's log",
                    op=op, role="worker", rank=0, seconds=seconds,
                    setting="job.collective_timeout_s",
                )  # fmt: skip
            time.sleep(self.poll_s)
        return self.store.get(key)

    # -- the gloo group -----------------------------------------------------------------

    def _leave_group(self) -> None:
        self.group.leave()

    def _form_group(self, prefix: str | None = None) -> None:
        start = time.perf_counter()
        self.group.reform(self.store, rank=self.group_rank, world=len(self.members),
                          prefix=prefix or f"{PREFIX}/group/{self.version}")  # fmt: skip
        log.info("worker %d (group rank %d of %d): group of membership version %d formed "
                 "in %.2f s", self.rank, self.group_rank, len(self.members), self.version,
                 time.perf_counter() - start)  # fmt: skip

    def regroup(self, members: tuple[int, ...], prefix: str) -> None:
        """Mid-pass, after a member died (:mod:`sparseps.online.leaving`): leave the gloo
        group and form one of ``members`` (launch ranks, group order) under ``prefix``.
        The version stays: the launcher's record of the leave (a newer version) is taken
        at the next boundary, which re-forms the group once more and drops a pass
        preloaded with the dead worker."""
        self._leave_group()
        self.members, self.world = tuple(members), len(members)
        self._form_group(prefix)
