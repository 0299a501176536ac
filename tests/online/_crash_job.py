"""The online job with a crash point: ``_crash_job.py CONFIG.yaml PHASE SEQ [BATCHES]``.

Launched like ``sparseps online`` launches ``sparseps/online/job.py`` (see
``_onlinetools.launch_crashing``); worker 0 exits with ``CRASH_EXIT_CODE`` at ``PHASE`` of
pass ``SEQ`` and the launcher stops the rest of the job.
"""

from __future__ import annotations

import sys

from sparseps.online import job
from sparseps.testing.crash import CrashPoint

if __name__ == "__main__":
    config, phase, seq, *rest = sys.argv[1:]
    crash = CrashPoint(phase, int(seq), batches=int(rest[0]) if rest else 1)
    sys.exit(job.main([config], on_phase=crash, save_hooks=crash))
