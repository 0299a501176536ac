"""Crash points: end a process at an exact phase of an online job's pass loop.

A :class:`CrashPoint` is an ``on_phase`` hook for
:class:`~sparseps.online.driver.OnlineDriver`. When the named phase of the pass with
sequence number ``seq`` is reached on worker ``rank``, it calls ``os._exit`` — no
cleanup, no flushing of anything but the log, like a killed process. The launcher then
stops the rest of the job. A test runs the job through a small script::

    # crash_job.py CONFIG.yaml PHASE SEQ [BATCHES]
    from sparseps.online import job
    from sparseps.testing.crash import CrashPoint
    crash = CrashPoint(sys.argv[2], int(sys.argv[3]))
    sys.exit(job.main([sys.argv[1]], on_phase=crash, save_hooks=crash))

and launches it with ``sparseps.online.online_cli.launch_argv(config, path, script=...)`` (the
hook travels as code, not through the environment).

Phases are those of :mod:`sparseps.online.phases`, plus ``mid_checkpoint``: during the
pass's checkpoint save, after the servers wrote the first table's shards and before the
manifest. A ``CrashPoint`` is a :class:`~sparseps.checkpoint.hooks.SaveHooks` for that:
handed to the driver as ``save_hooks`` (as above), the ``checkpoint`` phase of pass
``seq`` arms it and its ``after_table_saved`` then exits (worker 0). Nothing is patched
in any module.
"""

from __future__ import annotations

import logging
import os
import sys

from ..checkpoint.hooks import SaveHooks
from ..errors import ConfigError
from ..online.phases import PHASES, PhaseEvent

__all__ = ["CRASH_EXIT_CODE", "CRASH_PHASES", "CrashPoint"]

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 86  # distinctive, so a test can tell the crash point from other failures
CRASH_PHASES = (*PHASES, "mid_checkpoint")


class CrashPoint(SaveHooks):
    """Exit this process at ``phase`` of pass ``seq`` on worker ``rank``.

    For ``mid_checkpoint`` the same object must also be handed to the driver as its
    ``save_hooks`` (the phase event arms it, the save hook exits).

    Args:
        phase: one of :data:`CRASH_PHASES`.
        seq: the pass's global sequence number (0-based).
        batches: for ``train_batch``: exit when the reader takes this batch (>= 1).
        rank: the worker that exits (the others are stopped by the launcher).
        exit_code: the process's exit status.

    Raises:
        ConfigError: an unknown phase or an out-of-range number (names the argument).
    """

    def __init__(
        self, phase: str, seq: int, *, batches: int = 1, rank: int = 0,
        exit_code: int = CRASH_EXIT_CODE,
    ) -> None:  # fmt: skip
        if phase not in CRASH_PHASES:
            raise ConfigError(
                f"CrashPoint: unknown phase {phase!r}; expected one of {', '.join(CRASH_PHASES)}"
            )
        if seq < 0 or batches < 1 or rank < 0:
            raise ConfigError(
                f"CrashPoint: seq >= 0, batches >= 1 and rank >= 0; got seq={seq}, "
                f"batches={batches}, rank={rank}"
            )
        self.phase, self.seq, self.batches, self.rank = phase, seq, batches, rank
        self.exit_code = exit_code
        self._armed: str | None = None  # mid_checkpoint: where, once the checkpoint started

    def __call__(self, event: PhaseEvent) -> None:
        if event.rank != self.rank or event.pass_id.seq != self.seq:
            return
        if self.phase == "mid_checkpoint":
            if event.phase == "checkpoint":
                self._armed = f"checkpoint of pass {event.pass_id}"
            return
        if event.phase != self.phase:
            return
        if event.phase == "train_batch" and event.batches < self.batches:
            return
        self.crash(f"{event.phase} of pass {event.pass_id} (batch {event.batches})")

    def after_table_saved(self, table: str) -> None:
        """The save hook: exit here once the ``checkpoint`` phase of pass ``seq`` armed it."""
        if self._armed is not None:
            self.crash(f"{self._armed}, after table {table}")

    def crash(self, where: str) -> None:
        """Log where, flush the log, and exit without any cleanup."""
        log.warning("crash point: exiting with status %d at %s", self.exit_code, where)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.exit_code)
