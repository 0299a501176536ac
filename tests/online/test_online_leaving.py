"""Unit level of a worker's death in an online job (sparseps.online.leaving): the rank map,
the fence's decision on a store, the launcher's record of the leave, and the supervisor
taking a worker's death as a leave (or failing the job, with the reason, when the job's
workers do not follow membership: sync and geo)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from sparseps.env import MASTER, WORKER_NUM, Role
from sparseps.launch.records import ChildSpec, SupervisorConfig
from sparseps.launch.scaling import JobScaler, ScaleService
from sparseps.launch.supervisor import Supervisor
from sparseps.online.leaving import Fence, FenceDecision, LeaveAware, rank_map, share_of
from sparseps.online.membership import Decision, Membership, requested_members
from sparseps.store.client import StoreClient
from sparseps.store.server import StoreServer
from sparseps.store.worker_keys import ACCEPTS_WORKERS_KEY, FIXED_KEY, LEAVES_KEY, WORKERS_KEY

pytestmark = pytest.mark.timeout(60)


def test_rank_map_and_the_survivors_shares():
    assert rank_map([0, 2]) == {0: 0, 2: 1}
    assert rank_map([3, 0, 5]) == {0: 0, 3: 1, 5: 2}  # launch rank -> group rank (sorted)
    lost = ["c", "a", "b"]
    shares = [share_of(lost, r, [0, 2]) for r in (0, 2)]
    assert shares == [["a", "c"], ["b"]]  # every lost file once, over the survivors


def test_requested_members_and_decisions_with_a_gap():
    with StoreServer("127.0.0.1", 0) as server, StoreClient(server.address, timeout_s=5,
                                                         setting="-") as store:  # fmt: skip
        assert requested_members(store, 0, (0, 1, 2)) == (0, (0, 1, 2), ())
        store.set(WORKERS_KEY, json.dumps({"version": 1, "world": 2}))
        assert requested_members(store, 0, (0, 1, 2)) == (1, (0, 1), ())
        store.set(WORKERS_KEY, json.dumps({"version": 2, "world": 2, "members": [2, 0],
                                           "left": [1]}))  # fmt: skip
        assert requested_members(store, 1, (0, 1)) == (2, (0, 2), (1,))
        store.set(WORKERS_KEY, json.dumps({"version": 3, "world": 2, "members": [0, 0]}))
        assert requested_members(store, 2, (0, 2)) == (2, (0, 2), ())  # malformed: ignored
        # worker 0 decides from the record; launch rank 2 stays as group rank 1
        store.set(WORKERS_KEY, json.dumps({"version": 1, "world": 2, "members": [0, 2],
                                           "left": [1]}))  # fmt: skip
        zero = Membership(store, 0, version=0, world=3, collective_timeout_s=5, wait_s=5)
        decision = zero.decide({})
        assert (decision.version, decision.world, decision.ranks) == (1, 2, (0, 2))
        assert Decision.loads(decision.dumps()) == decision
        two = Membership(store, 2, version=0, world=3, collective_timeout_s=5, wait_s=5)
        two.version = 1  # already in the group of version 1: no re-form here
        two.members = (0, 2)
        assert two.apply(decision) and two.group_rank == 1
        one = Membership(store, 1, version=0, world=3, collective_timeout_s=5, wait_s=5)
        assert not one.apply(decision)  # a rank out of the members leaves


def test_the_fence_waits_for_arrivals_or_recorded_deaths_and_names_the_lost_rows():
    with StoreServer("127.0.0.1", 0) as server:
        stores = [StoreClient(server.address, timeout_s=5, setting="-") for _ in range(3)]
        members = [Membership(s, r, version=0, world=3, collective_timeout_s=5, wait_s=5)
                   for r, s in enumerate(stores)]  # fmt: skip
        fences = [Fence(m, seq=4, timeout_s=10, poll_s=0.01) for m in members]
        fences[1].publish_files(["f1"])  # worker 1 trains f1, takes 2 batches, dies
        fences[1].count_rows(32)
        fences[1].count_rows(32)
        decisions: dict[int, FenceDecision] = {}

        def meet(rank):
            decisions[rank] = fences[rank].meet()

        threads = [threading.Thread(target=meet, args=(r,)) for r in (0, 2)]
        for t in threads:
            t.start()
        threads[0].join(0.2)  # an absence has no event: the fence holds them for a while
        assert not decisions  # nobody goes on while worker 1 is neither here nor dead
        stores[0].set(
            WORKERS_KEY, json.dumps({"version": 1, "world": 2, "members": [0, 2], "left": [1]})
        )  # the launcher's record
        for t in threads:
            t.join(10)
        assert decisions[0] == decisions[2]
        assert decisions[0].departed == [1] and decisions[0].members == [0, 2]
        assert decisions[0].lost_files() == ["f1"]
        assert fences[0].summary() == {"left": [{"rank": 1, "files": ["f1"], "rows": 64}],
                                       "rows_reread": 64}  # fmt: skip
        # the next fence (after the regroup, which is gloo's: the members only here)
        for m in members:
            m.members = tuple(decisions[0].members)
        threads = [threading.Thread(target=meet, args=(r,)) for r in (0, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert decisions[0].departed == [] and decisions[2].members == [0, 2]
        for s in stores:
            s.close()


def test_a_member_that_neither_arrives_nor_is_recorded_dead_fails_the_fence_in_time():
    from sparseps.errors import DeadlineError

    with StoreServer("127.0.0.1", 0) as server, StoreClient(server.address, timeout_s=5,
                                                         setting="-") as store:  # fmt: skip
        # the membership's own limits are long: the fence gives up after its 0.3 s, not
        # theirs (the bound leaves room for a loaded box)
        members = Membership(store, 0, version=0, world=2, collective_timeout_s=30, wait_s=30)
        start = time.monotonic()
        with pytest.raises(DeadlineError, match=r"worker\(s\) \[1\].*job.collective_timeout_s"):
            Fence(members, seq=0, timeout_s=0.3, poll_s=0.01).meet()
        assert time.monotonic() - start < 10


def test_leave_aware_data_rereads_the_departed_files_after_regrouping():
    class FakeFence:
        rank = 2

        def __init__(self):
            self.rows, self.published, self.regrouped = 0, [], []
            self.decisions = [FenceDecision([1], [0, 2], {"1": ["b", "a", "c"]}, {"1": 5}),
                              FenceDecision([], [0, 2])]  # fmt: skip

        def publish_files(self, files):
            self.published.append(list(files))

        def count_rows(self, rows):
            self.rows += rows

        def meet(self):
            return self.decisions.pop(0)

        def regroup(self, decision):
            self.regrouped.append(decision.members)

    fence = FakeFence()
    data = LeaveAware([[1] * 3, [1] * 2], ["mine"], fence,  # type: ignore[arg-type]
                      lambda files: [[f] * 4 for f in files])  # fmt: skip
    assert [len(b) for b in data] == [3, 2, 4]  # its own rows, then its share: file "b"
    assert fence.regrouped == [[0, 2]] and fence.rows == 9
    assert fence.published == [["mine"], ["mine", "b"]]


WORKER = (
    "import os, signal, sys; os.kill(os.getpid(), signal.SIGKILL) if sys.argv[1] == '1' else None"
)


def _supervised(tmp_path: Path, store) -> tuple:
    master = store
    children = [
        ChildSpec(
            role=Role.WORKER,
            rank=r,
            argv=(sys.executable, "-c", WORKER, str(r)),
            env={**os.environ, WORKER_NUM: "3", MASTER: master},
            log_path=tmp_path / f"worker.{r}.log",
        )  # fmt: skip
        for r in range(3)
    ]
    supervisor = Supervisor(children=children, config=SupervisorConfig(poll_s=0.05),
                            pids_path=tmp_path / "pids.json")  # fmt: skip
    scaler = JobScaler(supervisor=supervisor, endpoints=["127.0.0.1:1"], host="127.0.0.1",
                       master=lambda: master)  # fmt: skip
    return supervisor, ScaleService(scaler, "127.0.0.1", workers=3)


@pytest.mark.parametrize("job", ["leaves", "sync", "plain"])
def test_the_supervisor_takes_a_killed_worker_as_a_leave_only_when_the_job_follows(
    tmp_path, caplog, job
):
    with StoreServer("127.0.0.1", 0) as server, StoreClient(server.address, timeout_s=5,
                                                         setting="-") as store:  # fmt: skip
        if job == "leaves":  # what an async online job with data.lease_s sets
            store.set(ACCEPTS_WORKERS_KEY, b"1")
            store.set(LEAVES_KEY, b"1")
        elif job == "sync":  # what worker 0 of a sync (or geo) online job sets
            store.set(FIXED_KEY, b"job.mode sync trains with a fixed set of workers")
        supervisor, service = _supervised(tmp_path, server.address)
        try:
            outcome = supervisor.run()
        finally:
            service.close()
        if job == "leaves":  # worker 1 left: the job completes with 0 and 2
            assert outcome.exit_code == 0, outcome
            assert json.loads(store.get(WORKERS_KEY)) == {
                "version": 1, "world": 2, "members": [0, 2], "left": [1]}  # fmt: skip
            assert "worker 1 (pid" in caplog.text and "LEFT the job" in caplog.text
            return
        # the death fails the job as before; a sync online job's log says why
        assert outcome.exit_code != 0 and outcome.failure.rank == 1, outcome
        assert not store.check([WORKERS_KEY])
        said = "cannot go on without it: job.mode sync trains with a fixed set" in caplog.text
        assert said == (job == "sync"), caplog.text


def test_a_newcomer_after_a_leave_joins_with_a_rank_above_the_world():
    with StoreServer("127.0.0.1", 0) as server, StoreClient(server.address, timeout_s=5,
                                                         setting="-") as store:  # fmt: skip
        zero = Membership(store, 0, version=1, world=3, collective_timeout_s=5, wait_s=5,
                          poll_s=0.01)  # fmt: skip
        zero.members = (0, 2)  # after the fence of the pass worker 1 died in
        # the launcher's leave, then `sparseps scale --workers 3`: rank 3, never rank 1
        store.set(WORKERS_KEY, json.dumps({"version": 3, "world": 3, "members": [0, 2, 3],
                                           "left": [1]}))  # fmt: skip
        newcomer = Membership(store, 3, version=0, world=0, collective_timeout_s=5,
                              wait_s=5, poll_s=0.01)  # fmt: skip
        decision = zero.decide({"seq": 0})
        assert (decision.ranks, decision.previous_ranks) == ((0, 2, 3), (0, 2))
        assert Decision.loads(decision.dumps()) == decision
        assert newcomer.join() == decision
        assert newcomer.members == (0, 2, 3) and newcomer.group_rank == 2
        # a process of a rank that stays a member is not admitted (it holds the rank)
        two = Membership(store, 2, version=0, world=0, collective_timeout_s=5, wait_s=0.3,
                         poll_s=0.01)  # fmt: skip
        assert two._verdict(decision, fresh=True) is False
