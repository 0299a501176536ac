"""The workers' ``torch.distributed`` group of this process: formed, re-formed and left here.

``sps.init()`` forms it among the launch's workers (or, in local mode, a group of one); an
online job's membership re-forms it at a pass boundary when workers join or leave, and
mid-pass when one dies (:mod:`sparseps.online.membership`). Every one of them goes through
a :class:`WorkerGroup`, so that the backend (gloo, or the CURVE group of a ``--secure``
job: :func:`~sparseps.runtime.rendezvous.worker_backend`), its options and the collective
timeout are chosen in one place, and a secure job's group never opens a plain socket.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from ..env import RoleEnv
from .rendezvous import group_options, worker_backend

__all__ = ["WorkerGroup"]

log = logging.getLogger(__name__)


class WorkerGroup:
    """This process's place in the workers' group.

    Args:
        timeout_s: the timeout of every collective of the groups it forms.
        env: this worker's role (its keys in a secure job); None: read from the
            environment when a group forms.
    """

    def __init__(self, *, timeout_s: float, env: RoleEnv | None = None) -> None:
        self.timeout_s = timeout_s
        self.env = env
        self.owned = False  # whether this object formed the group that is up

    @staticmethod
    def formed() -> bool:
        """Whether ``torch.distributed`` has a group in this process (ours or another's)."""
        import torch.distributed as dist

        return dist.is_initialized()

    def form(self, store, *, rank: int, world: int, prefix: str) -> bool:
        """Form the group of ``world`` workers on ``store`` (keys under ``prefix``).

        Returns False, forming nothing, when the process already has a group (formed by
        the application before ``sps.init()``: sparseps then uses that one).

        Raises:
            ConfigError: a secure job's keys do not load.
            RuntimeError: the group could not form (torch's, or
                :class:`~sparseps.rpc.mesh.GroupError` naming the worker that is missing or
                refused this worker's key).
        """
        import torch.distributed as dist

        if dist.is_initialized():
            return False
        backend = worker_backend(self.env)
        start = time.perf_counter()
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(prefix, store),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=self.timeout_s),
            pg_options=None if backend == "gloo" else group_options(self.env),
        )
        self.owned = True
        log.debug("group rank %d of %d formed (%s, %s) in %.2f s", rank, world, backend,
                  prefix, time.perf_counter() - start)  # fmt: skip
        return True

    def form_alone(self) -> bool:
        """A group of this process alone (local mode; an online newcomer until it joins)."""
        import torch.distributed as dist

        return self.form(dist.HashStore(), rank=0, world=1, prefix="sparseps/alone")

    def reform(self, store, *, rank: int, world: int, prefix: str) -> None:
        """Leave the group that is up, whoever formed it, and form this one."""
        self.leave()
        self.form(store, rank=rank, world=world, prefix=prefix)

    def leave(self) -> None:
        """Tear down the group that is up (if any), whoever formed it."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self.owned = False
