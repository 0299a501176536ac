"""Named points of the pass loop where the driver calls an optional hook.

:class:`~sparseps.online.driver.OnlineDriver` takes ``on_phase``, a callable that gets a
:class:`PhaseEvent` at each of :data:`PHASES`, on every worker. Tests use it to stop a
job at an exact point (:class:`sparseps.testing.crash.CrashPoint`); tools may use it to
observe progress. A hook runs inline, so it must be fast, and an exception it raises
stops the job like any other error.

Phases of one trained pass, in order:

- ``pass_start``: the pass's data is in memory (before the shuffle);
- ``evaluated``: progressive metrics computed, training not started;
- ``train_batch``: the trainer's reader took batch ``batches`` (1, 2, ...) of this
  worker's share; it runs in the reader thread, a few batches ahead of the optimizer;
- ``trained``: the pass is trained (and, at the end of a day, decayed and shrunk);
- ``inference_saved``: the pass's inference model is saved (only if it saves one);
- ``predicted``: the pass's prediction step wrote its folder (only with ``predict``);
- ``checkpoint`` / ``checkpointed``: just before / after its checkpoint (only if it
  saves one);
- ``ledger_written``: worker 0 appended the pass record (before the closing barrier).

An evaluate-only pass has ``pass_start``, ``evaluated`` and ``ledger_written``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .layout import PassId

if TYPE_CHECKING:
    from ..data.schema import Batch

__all__ = ["PHASES", "CountingDataset", "PhaseEvent", "PhaseHook"]

PHASES = (
    "pass_start",
    "evaluated",
    "train_batch",
    "trained",
    "inference_saved",
    "predicted",
    "checkpoint",
    "checkpointed",
    "ledger_written",
)


@dataclass(frozen=True)
class PhaseEvent:
    """One phase of one pass on one worker (``batches``: only for ``train_batch``)."""

    phase: str
    pass_id: PassId
    rank: int
    batches: int = 0


PhaseHook = Callable[[PhaseEvent], None]


class CountingDataset:
    """Iterates ``dataset`` and reports ``train_batch`` after each batch it hands out.

    Only used when a hook is set, so a job without one iterates the dataset directly.
    """

    def __init__(
        self, dataset: Collection[Batch], hook: PhaseHook, pass_id: PassId, rank: int
    ) -> None:
        self._dataset = dataset
        self.pass_data = dataset  # the batches it yields (a prepared GPUPS pass is of them)
        self._hook = hook
        self._pass_id = pass_id
        self._rank = rank

    def __len__(self) -> int:
        return len(self._dataset)

    def __iter__(self) -> Iterator:
        for count, batch in enumerate(self._dataset, 1):
            self._hook(PhaseEvent("train_batch", self._pass_id, self._rank, count))
            yield batch
