"""What a :class:`~sparseps.worker.trainer.Trainer` does to its features and model files
between passes: decay, shrink and tombstones, checkpoints and inference saves.

Each is collective (every worker calls it): the modes' pending pushes land first
(``quiesce``), worker 0 asks the servers, a barrier ends it. The file formats and their
coordination live in :mod:`sparseps.checkpoint`; this is the trainer's door to them, mixed
into ``Trainer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core import collectives

if TYPE_CHECKING:
    from ..checkpoint.hooks import SaveHooks
    from ..rpc.client import PSClient
    from .state import TrainingState
    from .strategy import Strategy

__all__ = ["TrainerLifecycle"]


class TrainerLifecycle:
    """Decay, shrink, checkpoints and inference saves, mixed into ``Trainer``."""

    if TYPE_CHECKING:  # the Trainer's (trainer.py)
        state: TrainingState
        strategy: Strategy

        def _start(self) -> None: ...
        @property
        def _mode(self): ...
        @property
        def _client(self) -> PSClient: ...
        @property
        def rank(self) -> int: ...
        @property
        def tables(self) -> dict: ...

    def decay(self, rate: float | None = None) -> None:
        """Decay show/click of every table (end of a day); ``rate`` default: the table's."""
        self._start()
        self._mode.quiesce()
        if self.rank == 0:
            for name in self.tables:
                self._client.decay(name, rate)
        collectives.barrier(timeout=self.strategy.collective_timeout)

    def shrink(self) -> dict[str, int]:
        """Delete rows by score / unseen days; deleted keys become tombstones of the next delta."""
        self._start()
        self._mode.quiesce()
        deleted = {}
        if self.rank == 0:
            for name in self.tables:
                keys = self._client.shrink(name)
                self.state.add_tombstones(name, keys)
                deleted[name] = int(keys.size)
        collectives.barrier(timeout=self.strategy.collective_timeout)
        return deleted

    def tombstones(self, table: str) -> np.ndarray:
        """Keys deleted by shrink since the last inference save (worker 0)."""
        return self.state.tombstones(table)

    def save_checkpoint(
        self, directory: str | Path, *, state: dict | None = None, hooks: SaveHooks | None = None
    ) -> dict | None:
        """Save everything needed to resume (collective); see :mod:`sparseps.checkpoint`.

        ``hooks``: a :class:`~sparseps.checkpoint.hooks.SaveHooks` (fault injection for
        tests); None for none.
        """
        from ..checkpoint import trainer_files
        from ..checkpoint.hooks import NO_HOOKS

        return trainer_files.save_checkpoint(self, directory, state=state, hooks=hooks or NO_HOOKS)

    def load_checkpoint(self, directory: str | Path) -> dict:
        """Load a checkpoint (any number of servers); returns the saved ``state``."""
        from ..checkpoint import trainer_files

        return trainer_files.load_checkpoint(self, directory)

    def save_inference_model(
        self, directory: str | Path, *, mode: str = "base", hooks: SaveHooks | None = None
    ) -> Path | None:
        """Save filtered embeddings + the exported dense head (``mode`` base or delta).

        ``hooks``: a :class:`~sparseps.checkpoint.hooks.SaveHooks` (fault injection for
        tests); None for none.
        """
        from ..checkpoint import trainer_files
        from ..checkpoint.hooks import NO_HOOKS

        return trainer_files.save_inference_model(
            self, directory, mode=mode, hooks=hooks or NO_HOOKS
        )
