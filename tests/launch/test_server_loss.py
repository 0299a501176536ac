"""Which server losses a replicated job survives, and when it starts replacements
(:class:`sparseps.launch.server_loss.ServerLoss`), on processes that really exited.

The whole path (a SIGKILLed server of a launched job, its replacement copying its shards
back) is tests/replication/test_replica_launch.py; these are the policy's cases that a
launched job reaches only with several kills: the loss that leaves a shard without a copy,
the replacement budget running out, a second look at an already tolerated loss.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from sparseps.env import RECOVER, Role
from sparseps.launch.children import Child
from sparseps.launch.records import ChildSpec
from sparseps.launch.server_loss import ServerLoss


def _exited(role: Role, rank: int, code: int = 1) -> Child:
    """A child whose process has exited with ``code``."""
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait(timeout=60)
    pump = threading.Thread(target=lambda: None)
    pump.start()
    spec = ChildSpec(role, rank, ("server",), {"A": "1"}, Path(f"{role.value}.{rank}.log"))
    return Child(spec, proc, 0, pump, time.monotonic(), exit_code=proc.returncode)


def test_without_replicas_no_loss_is_tolerated():
    started = []
    loss = ServerLoss(0, 3, 5, lambda *a: started.append(a))
    assert not loss.tolerated(_exited(Role.SERVER, 1))
    assert started == [] and loss.lost == set()


def test_a_heter_worker_exit_is_never_tolerated():
    loss = ServerLoss(1, 3, 5, lambda *a: None)
    assert not loss.tolerated(_exited(Role.HETER_WORKER, 1))


def test_losses_are_tolerated_while_every_shard_keeps_a_copy_then_the_job_fails():
    started = []
    loss = ServerLoss(1, 4, 0, lambda *a: started.append(a))  # no replacements allowed
    first = _exited(Role.SERVER, 1)
    assert loss.tolerated(first) and loss.lost == {1}
    assert loss.tolerated(first)  # looked at again (each loop pass): still tolerated
    # servers 1 and 3 hold no shard together (chains 0-1, 1-2, 2-3, 3-0)
    assert loss.tolerated(_exited(Role.SERVER, 3)) and loss.lost == {1, 3}
    fatal = _exited(Role.SERVER, 2, code=-9)
    assert not loss.tolerated(fatal)  # shard 1 lived on servers 1 and 2, shard 2 on 2 and 3
    assert "no live copy of shard(s) 1, 2 is left" in fatal.note, fatal.note
    assert "lost servers: server 1, server 2, server 3" in fatal.note, fatal.note
    assert "--replicas 1" in fatal.note
    assert started == []
    assert loss.lost == {1, 3}  # the fatal loss is the job's failure, not a tolerated one


def test_a_tolerated_loss_is_replaced_while_the_budget_lasts():
    started = []
    loss = ServerLoss(1, 3, 1, lambda *a: started.append(a))
    lost = _exited(Role.SERVER, 2)
    assert loss.tolerated(lost)
    assert len(started) == 1
    child, spec, attempt = started[0]
    assert child is lost and attempt == 1 and loss.replacements == 1
    assert spec.rank == 2 and spec.role is Role.SERVER
    assert spec.env == {"A": "1", RECOVER: "1"}  # the replacement copies from survivors
    assert loss.lost == set()  # replaced: its rank serves again
    # the budget is spent: the next loss is tolerated (every shard keeps a copy) but not
    # replaced, and stays among the lost
    assert loss.tolerated(_exited(Role.SERVER, 0))
    assert len(started) == 1 and loss.lost == {0}
