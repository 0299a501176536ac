"""The job's store client as a ``torch.distributed.Store``: gloo's rendezvous runs on it.

Apart from :mod:`.store` because it imports torch: only processes that form a gloo group
(the workers, tests of it) need this class; the launcher and ``sparseps scale`` talk to
the same stores through :class:`~sparseps.store.client.StoreClient` without torch.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from .client import StoreClient

__all__ = ["ZmqStore"]


class ZmqStore(StoreClient, dist.Store):
    """A :class:`~sparseps.store.client.StoreClient` usable wherever torch takes a ``Store``.

    Same arguments and errors as :class:`~sparseps.store.client.StoreClient`; the
    timeout is torch's (``set_timeout`` changes it, as gloo does).
    """

    def __init__(self, address: str, *, timeout_s: float, **options) -> None:
        super().__init__(address, timeout_s=timeout_s, **options)
        self.set_timeout(timedelta(seconds=timeout_s))

    def _timeout_s(self) -> float:
        # torch's stub of Store lacks `timeout` (a property of the C++ class, set_timeout's pair)
        return self.timeout.total_seconds()  # type: ignore[attr-defined]
