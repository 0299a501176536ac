"""The online job with one worker SIGKILLed mid-pass: ``_leave_job.py CONFIG.yaml RANK SEQ
BATCHES``.

Launched like ``sparseps online`` launches ``sparseps/online/job.py`` (see
``test_online_worker_dies.py``); worker ``RANK`` kills itself with SIGKILL when its
trainer's reader takes batch ``BATCHES`` of pass ``SEQ`` (the driver has counted that
batch's rows on the store by then: the rows it took are exactly ``BATCHES`` batches).
"""

from __future__ import annotations

import os
import signal
import sys

import sparseps as sps
from sparseps import env as sps_env
from sparseps.online import job
from sparseps.online.phases import PhaseEvent


class KillAt:
    def __init__(self, rank: int, seq: int, batches: int) -> None:
        self.rank, self.seq, self.batches = rank, seq, batches

    def __call__(self, event: PhaseEvent) -> None:
        if (event.phase, event.rank, event.pass_id.seq, event.batches) == (
            "train_batch", self.rank, self.seq, self.batches,
        ):  # fmt: skip
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    config, rank, seq, batches = sys.argv[1:]
    role = sps_env.from_environ()
    if role is not None and role.role is sps_env.Role.SERVER:
        sps.init()  # served before job.main imports torch (as _crash_job.py)
        sps.run_server()
        sys.exit(0)
    # a worker's sps.init() is job.main's: a worker started by a scale must be known as a
    # newcomer before it (sparseps.online.membership.is_newcomer)
    sys.exit(job.main([config], on_phase=KillAt(int(rank), int(seq), int(batches))))
