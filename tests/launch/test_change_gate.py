"""The one rule of scale requests against a job's completion (sparseps.launch.change_gate)."""

import threading

from sparseps.launch.change_gate import ChangeGate
from sparseps.launch.records import FINISHING_NOTE


def test_a_request_in_flight_holds_completion_and_one_after_it_is_refused():
    gate = ChangeGate(threading.RLock())
    assert gate.begin() == "" and gate.in_flight == 1
    assert not gate.finish(done=True) and not gate.finishing  # the request may add a worker
    gate.end()
    assert not gate.finish(done=False)  # workers still running: not yet
    assert gate.finish(done=True) and gate.finishing
    assert gate.begin() == FINISHING_NOTE and gate.in_flight == 0  # refused, not counted
    gate.reopen()  # a group restart starts a new generation
    assert not gate.finishing and gate.begin() == "" and gate.in_flight == 1
