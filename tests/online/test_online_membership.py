"""Membership decisions at pass boundaries (sparseps.online.membership), on an in-process
store: what worker 0 decides from ``elastic/workers`` and what a newcomer does with each
decision (join, wait, leave). The processes, the groups and the ledger are in
test_online_scale_workers.py (launched) and test_online_workers_steal.py."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch.distributed as dist

from sparseps.errors import DeadlineError
from sparseps.online.membership import ACCEPTS_KEY, ELASTIC_KEY, Membership, requested_workers


def _member(store, rank: int, world: int = 2, **kw) -> Membership:
    return Membership(store, rank, version=0, world=world, collective_timeout_s=10,
                      wait_s=kw.pop("wait_s", 5), poll_s=0.01, **kw)  # fmt: skip


def _request(store, version: int, world: int) -> None:
    store.set(ELASTIC_KEY, json.dumps({"version": version, "world": world}))


def _joining(pool: ThreadPoolExecutor, newcomer: Membership) -> Future:
    """``newcomer.join()`` in a thread, once it has looked at the store's latest decision
    (waited for, not slept on: a loaded box may start the thread late)."""
    looked = threading.Event()
    latest = newcomer._latest

    def first_look() -> int:
        value = latest()
        looked.set()
        return value

    newcomer._latest = first_look
    future = pool.submit(newcomer.join)
    assert looked.wait(30), "the newcomer never looked at the store"
    return future


def _boundary(leader: Membership, seq: int):
    """Worker 0 decides the next boundary and follows it (without forming groups)."""
    decision = leader.decide({"seq": seq, "passes": seq + 1, "has_base": True,
                              "last_checkpoint": None})  # fmt: skip
    leader.boundary = decision.boundary
    leader.version, leader.world = decision.version, decision.world
    return decision


def test_worker_0_decides_from_the_request_and_members_read_it():
    store = dist.HashStore()
    leader, other = _member(store, 0), _member(store, 1)
    leader.start()
    assert store.check([ACCEPTS_KEY])
    first = _boundary(leader, 0)
    assert (first.version, first.world) == (0, 2)  # no request: the launch's workers
    _request(store, 1, 3)
    second = _boundary(leader, 1)
    assert (second.boundary, second.version, second.world, second.previous) == (2, 1, 3, 2)
    other.boundary = 1
    assert other.decide({}) == second  # a member reads worker 0's decision
    _request(store, 0, 1)  # an older version than the group's: ignored
    assert (_boundary(leader, 2).version, leader.world) == (1, 3)
    store.set(ELASTIC_KEY, b"not json")  # malformed: logged and ignored
    assert requested_workers(store, (1, 3)) == (1, 3)
    _request(store, 2, 0)  # world out of range: ignored
    assert requested_workers(store, (1, 3)) == (1, 3)


def test_newcomer_joins_the_boundary_that_admits_it_even_after_a_later_request():
    store = dist.HashStore()
    leader = _member(store, 0)
    _boundary(leader, 0)
    _request(store, 1, 3)
    admitted = _boundary(leader, 1)
    # the shrink is requested before worker 2 looked: the members still wait for it
    _request(store, 2, 2)
    newcomer = _member(store, 2, world=0)
    assert newcomer.join() == admitted
    assert (newcomer.version, newcomer.world, newcomer.boundary) == (1, 3, 2)
    # a second process for rank 2 (the slot is taken) waits for a newer decision ...
    late = _member(store, 2, world=0, wait_s=0.3)
    with pytest.raises(DeadlineError, match="no pass boundary admitted it"):
        late.join()
    # ... and leaves when that one keeps the first process (rank held by a member)
    with ThreadPoolExecutor(1) as pool:
        again = _joining(pool, _member(store, 2, world=0))
        _request(store, 3, 3)
        _boundary(leader, 2)
        assert again.result(5) is None


def _scaled_down_first(store, leader: Membership) -> None:
    _request(store, 2, 2)
    _boundary(leader, 1)


def _job_ends(store, leader: Membership) -> None:
    leader.end({"seq": 1})


@pytest.mark.parametrize("ending", [_scaled_down_first, _job_ends],
                         ids=["scaled_down_first", "at_the_end_of_the_job"])  # fmt: skip
def test_newcomer_waits_through_old_boundaries_and_leaves(ending):
    store = dist.HashStore()
    leader = _member(store, 0)
    _boundary(leader, 0)  # a boundary of the launch's 2 workers, before the scale
    _request(store, 1, 3)
    # the decision present at its start predates its scale: it waits for the next one,
    # which does not include it (scaled down again meanwhile), or for the job's end: it
    # leaves
    with ThreadPoolExecutor(1) as pool:
        newcomer = _joining(pool, _member(store, 2, world=0))
        assert not newcomer.done()
        ending(store, leader)
        assert newcomer.result(5) is None
