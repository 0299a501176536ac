"""The keys of the workers' store through which the launcher and an online job's workers
agree on who the workers are (docs/elastic.md, "Workers joining and leaving").

One home for both sides: the launcher (:mod:`sparseps.launch.scaling`) writes the
requested membership and reads what the workers allow; the workers
(:mod:`sparseps.online.membership`, :mod:`sparseps.online.leaving`) do the opposite.
"""

from __future__ import annotations

__all__ = ["ACCEPTS_WORKERS_KEY", "FIXED_KEY", "LEAVES_KEY", "MEMBERS_PREFIX", "WORKERS_KEY"]

# written by the launcher (sparseps scale --workers, a worker's death as a leave):
# {"version", "world"} and, once a worker died and left, "members" and "left"
WORKERS_KEY = "elastic/workers"
# written by worker 0 of a job whose workers follow membership (async online jobs)
ACCEPTS_WORKERS_KEY = "elastic/accepts_workers"
# written by worker 0 of a job whose workers may die and leave (steal split with leases)
LEAVES_KEY = "elastic/leave_on_death"
# written by worker 0 of a sync/geo job: why its workers are fixed (a death fails it)
FIXED_KEY = "elastic/fixed_workers"
# the workers' own decisions at pass boundaries (worker 0 writes, the others read)
MEMBERS_PREFIX = "sparseps/online/members"
