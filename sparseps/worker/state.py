"""A worker's training state, with a name: what the trainer and the checkpoint code share.

The :class:`~sparseps.worker.trainer.Trainer` makes one ``TrainingState`` in its
constructor, with every field in place; :meth:`TrainingState.start` connects it (role,
client, tables, the training mode) on first use, because a trainer is also constructed
in server processes of the same script, where it must not connect. The checkpoint code
(:mod:`sparseps.checkpoint.trainer_files`) works through these methods and fields, never
through the trainer's private attributes.

Fields:
    client: the :class:`~sparseps.rpc.client.PSClient` (None until started or after close).
    mode: the training mode (None until started or after close).
    rank, server_num: this worker's rank and the number of servers (set by ``start``).
    passes: training passes completed (saved in checkpoints).
    tables: ``{table name: TableConfig}`` of every table the model reads.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .. import role
from ..core import collectives
from ..core.closing import Closing
from ..core.keysets import unique_keys
from ..env import Role
from ..errors import ConfigError
from ..rpc.client import PSClient
from .dense_params import DenseParams
from .modes import TrainingMode, make_mode
from .strategy import Strategy

__all__ = ["TrainingState", "serve_if_heter_worker"]

log = logging.getLogger(__name__)


def serve_if_heter_worker(trainer) -> None:
    """In a heter worker's process, a Trainer serves the dense network, then the process
    exits 0 (the rest of the script is a trainer's): the same script runs in every role."""
    env = role.role_env()
    if env is None or env.role is not Role.HETER_WORKER:
        return
    from .heter_service import serve_from_env

    serve_from_env(trainer)
    raise SystemExit(0)


class TrainingState(Closing):
    """Client, mode, step counters, dense parameters and pending tombstones of one worker.

    Args:
        model: the torch model (its dense parameters are the mode's ``DenseParams``).
        tables: ``{name: TableConfig}`` the model reads.
        strategy: the training mode and its knobs.
        dense_rule: the dense optimizer rule.
        client: an existing client, or None to connect to ``sps.server_endpoints()``.
        num_threads: torch compute threads, set on start (None: leave torch's setting).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tables: dict,
        strategy: Strategy,
        dense_rule,
        *,
        client: PSClient | None = None,
        num_threads: int | None = 1,
    ):
        self.model = model
        self.tables = dict(tables)
        self.strategy = strategy
        self.dense_rule = dense_rule
        self.client = client
        self.num_threads = num_threads
        self.mode: TrainingMode | None = None
        self.rank = 0
        self.server_num = 0
        self.passes = 0
        self._tombstones: dict[str, list[np.ndarray]] = {}

    @property
    def started(self) -> bool:
        return self.mode is not None

    def start(self) -> bool:
        """Connect on first use (idempotent); True when this call did the starting."""
        if self.mode is not None:
            return False
        env = role.role_env() or role.init()
        if not role.is_worker():
            raise ConfigError("Trainer runs on workers; a server process calls sps.run_server()")
        if self.client is None:
            self.client = PSClient(role.server_endpoints(), timeout=self.strategy.rpc_timeout)
        for config in self.tables.values():
            self.client.create_table(config)
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        self.rank, self.server_num = env.rank, len(role.server_endpoints())
        strategy = self.strategy.resolved(heter_workers=bool(env.heter_workers))
        log.info("worker %d: training mode %r", env.rank, strategy.mode)
        self.mode = make_mode(
            strategy,
            self.client,
            DenseParams(self.model),
            self.dense_rule,
            env.rank,
            tables=list(self.tables.values()),
        )
        self.mode.place_model(self.model)
        return True

    @property
    def mode_name(self) -> str:
        """The training mode's name (the one the job runs, once started)."""
        return self.strategy.mode_name if self.mode is None else self.mode.config.name

    def _started_mode(self) -> TrainingMode:
        """The training mode; only called once started (the mode is set by ``start``)."""
        assert self.mode is not None, "TrainingState is not started"
        return self.mode

    def quiesce(self) -> None:
        """Start if needed; every update sent so far is applied and every worker is here."""
        self.start()
        self._started_mode().quiesce()

    # -- dense parameters ---------------------------------------------------------------

    @property
    def dense_size(self) -> int:
        return self._started_mode().dense.size

    def save_dense(self, folder) -> str:
        """Worker 0: write the dense parameters + optimizer state; returns the file name."""
        return self._started_mode().save_dense(folder)

    def load_dense(self, path) -> None:
        """Worker 0: restore the dense parameters + optimizer state where they live."""
        self._started_mode().load_dense(path)

    def load_dense_local(self, path) -> None:
        """Every worker, after ``load_dense``: make the local copy current."""
        self._started_mode().load_dense_local(path)

    # -- features between passes (collective: every worker calls them) ----------------

    def decay(self, rate: float | None = None) -> None:
        """Decay show/click of every table (end of a day); ``rate`` default: the table's.
        Pending pushes land first; worker 0 asks the servers; a barrier ends it."""
        self.quiesce()
        client = self._started_client()
        if self.rank == 0:
            for name in self.tables:
                client.decay(name, rate)
        collectives.barrier(timeout=self.strategy.collective_timeout)

    def shrink(self) -> dict[str, int]:
        """Delete rows by score / unseen days; deleted keys become tombstones of the next
        delta (worker 0 keeps them); ``{table: rows deleted}`` on worker 0."""
        self.quiesce()
        client = self._started_client()
        deleted = {}
        if self.rank == 0:
            for name in self.tables:
                keys = client.shrink(name)
                self.add_tombstones(name, keys)
                deleted[name] = int(keys.size)
        collectives.barrier(timeout=self.strategy.collective_timeout)
        return deleted

    def _started_client(self) -> PSClient:
        assert self.client is not None, "TrainingState is not started"
        return self.client

    # -- tombstones: keys deleted by shrink since the last inference save (worker 0) ----

    def add_tombstones(self, table: str, keys: np.ndarray) -> None:
        self._tombstones.setdefault(table, []).append(keys)

    def tombstones(self, table: str) -> np.ndarray:
        parts = self._tombstones.get(table, [])
        return unique_keys(np.concatenate(parts)) if parts else np.empty(0, np.uint64)

    def replace_tombstones(self, tombstones: dict[str, np.ndarray]) -> None:
        """A loaded checkpoint's pending deletions replace whatever this process had."""
        self._tombstones = {name: [keys] for name, keys in tombstones.items()}

    def clear_tombstones(self) -> None:
        self._tombstones.clear()

    def close(self) -> None:
        """Flush pending pushes and close the connection; a later ``start`` reconnects."""
        if self.mode is not None:
            self.mode.close()
            self.mode = None
        if self.client is not None:
            self.client.close()
            self.client = None
