"""Ask servers to stop over a bare :class:`~sparseps.rpc.channel.Channel`.

A launcher stops its job's servers when the workers are done. :class:`PSClient` would
do it too, but loading it loads the table code and its compiled kernels (numba, about
half a second of a launcher's CPU); the stop op needs only the wire.
"""

from __future__ import annotations

from collections.abc import Sequence

from .channel import Channel
from .handle import Handle
from .limits import Limits
from .security import Security, security_from_env

__all__ = ["stop_servers"]


def stop_servers(
    endpoints: Sequence[str],
    ranks: Sequence[int],
    *,
    timeout: float,
    job_id: str | None = None,
    security: Security | None = None,
) -> None:
    """Send ``stop`` to servers ``ranks`` of ``endpoints`` and wait for each to answer
    (each then exits), as ``PSClient.stop_servers(ranks=...)`` does.

    Args:
        security: the job's CURVE keys; None: from the environment, as a PSClient.

    Raises:
        DeadlineError / UnavailableError: a server did not answer within ``timeout``.
    """
    channel = Channel(
        endpoints,
        timeout=timeout,
        timeout_setting="the launcher's server stop timeout",
        max_in_flight=max(1, len(ranks)),
        limits=Limits(),
        security=security if security is not None else security_from_env(),
        job_id=job_id,
    )
    try:
        calls = [channel.submit(rank, "stop", None) for rank in ranks]
        Handle(channel, calls, lambda replies: None).wait(timeout)
    finally:
        channel.close()
