"""How a wait on a worker-to-worker collective turns into a named error.

torch.distributed (gloo) reports a timeout and a dead peer alike, as ``RuntimeError``.
The rule, written once for the trainer's collectives and the metrics' all-reduce: a wait
that lasted at least 90% of its limit, or whose message says it timed out, is a
:class:`~sparseps.errors.DeadlineError` naming the operation, this worker, the seconds
waited and the setting that changes the limit; anything else means a peer left the group
(:class:`~sparseps.errors.UnavailableError`).

In a launched job a timeout first dumps the stacks of every role
(:func:`sparseps.observe.diagnose.diagnosed`) and its message names the folder: who was
stuck where when this worker gave up.
"""

from __future__ import annotations

import datetime
import time

from ..errors import DeadlineError, UnavailableError
from ..observe.diagnose import diagnosed

__all__ = ["wait_collective"]


def wait_collective(work, *, op: str, timeout: float, rank: int, setting: str, hint: str) -> None:
    """Wait on an async collective ``work`` for at most ``timeout`` seconds.

    Args:
        work: what ``torch.distributed.<collective>(..., async_op=True)`` returned.
        op: the operation, first word of the message (e.g. ``"worker barrier"``).
        timeout: seconds.
        rank: this worker's rank in the group.
        setting: the setting that raises the limit (the error's ``setting``).
        hint: what to do, the end of the timeout message.

    Raises:
        DeadlineError: not every worker joined in time (naming the dump folder of the
            automatic diagnosis in a launched job).
        UnavailableError: a worker left the process group.
    """
    start = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        waited = time.monotonic() - start
        if waited >= 0.9 * timeout or "timed out" in str(exc).lower():
            timeout_error = DeadlineError(
                f"{op}: not every worker joined within {timeout:.0f} s (this is worker "
                f"{rank}); a worker is stuck or far behind - {hint}",
                op=op,
                role="worker",
                rank=rank,
                seconds=waited,
                setting=setting,
            )
            raise diagnosed(timeout_error) from exc
        raise UnavailableError(
            f"{op}: a worker left the process group ({exc}); see that worker's log",
            op=op,
            role="worker",
            rank=rank,
        ) from exc
