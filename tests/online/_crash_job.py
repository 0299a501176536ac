"""The online job with a crash point: ``_crash_job.py CONFIG.yaml PHASE SEQ [BATCHES]``.

Launched like ``sparseps online`` launches ``sparseps/online/job.py`` (see
``_onlinetools.launch_crashing``); worker 0 exits with ``CRASH_EXIT_CODE`` at ``PHASE`` of
pass ``SEQ`` and the launcher stops the rest of the job.
"""

from __future__ import annotations

import sys

import sparseps as sps
from sparseps.online import job
from sparseps.testing.crash import CrashPoint

if __name__ == "__main__":
    config, phase, seq, *rest = sys.argv[1:]
    sps.init()
    if sps.is_server():
        # Served here, before job.main imports the driver (and with it torch: seconds of
        # CPU per server on 2 cores). The crash is worker 0's; job.main's own server path
        # runs in every resume, which is plain ``sparseps online``.
        sps.run_server()
        sys.exit(0)
    crash = CrashPoint(phase, int(seq), batches=int(rest[0]) if rest else 1)
    sys.exit(job.main([config], on_phase=crash, save_hooks=crash))
