"""Save hooks: named points inside a save where a test can inject a fault.

A :class:`SaveHooks` object is handed to the code under test (``trainer.save_checkpoint(
DIR, hooks=...)``, ``trainer.save_inference_model(DIR, hooks=...)``,
``staging.commit(..., hooks=...)``, the online driver's ``save_hooks``), in the spirit of
trio's instruments: the library calls its methods at the named points and never reads a
module global. The base class does nothing at every point; a test subclasses it and
overrides the points it needs (raise, sleep, or exit the process there).

Example::

    class StallAfterFirstTable(SaveHooks):
        def after_table_saved(self, table: str) -> None:
            time.sleep(120)  # the test kills a server now

    trainer.save_checkpoint(path, hooks=StallAfterFirstTable())
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["NO_HOOKS", "SaveHooks"]


class SaveHooks:
    """The points of a save a test may act at; every method does nothing here."""

    def after_table_saved(self, table: str) -> None:  # noqa: B027 - a no-op point by design
        """After the servers wrote ``table``'s files into the staging folder, before the
        manifest (checkpoint and inference saves, worker 0)."""

    def between_renames(self, target: Path) -> None:  # noqa: B027 - a no-op point by design
        """Between the two renames of the non-atomic fallback of :func:`staging.commit`:
        the old folder is aside and the new one not in place yet."""


NO_HOOKS = SaveHooks()
