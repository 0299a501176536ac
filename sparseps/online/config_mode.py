"""``job.mode`` of an online config: any :class:`sparseps.Strategy` mode, with its knobs.

A mode is a name (its defaults) or a mapping of the name and the mode's own knobs, read by
:meth:`sparseps.Strategy.from_dict` and checked by the mode's config class
(:mod:`sparseps.worker.strategy`): the YAML takes exactly what ``Strategy`` takes::

    job: {mode: sync}
    job: {mode: {name: sync, backup_workers: 1}}       # backup workers
    job: {mode: {name: async, max_staleness: 4}}       # bounded staleness
    job: {mode: hybrid}
    job: {mode: heter, heter_worker_num: 1}            # the dense network on heter workers
    job: {mode: {name: heter, sync: true}, heter_worker_num: 1}   # heter in sync mode

What each mode keeps of the online guarantees (docs/online.md, "Modes"): the ledger is
exactly-once in every mode (it is the driver's, not the mode's); a crash and rerun gives
the uninterrupted run's model bit for bit where the mode is deterministic
(:func:`deterministic`), and a model within the documented bound otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from ..worker.strategy import MODES, Mode, Strategy

__all__ = ["NOT_ONLINE", "deterministic", "mode_from_config", "mode_name"]

# Modes ``sparseps online`` does not run, with the reason (none: gpups came with issue 56).
NOT_ONLINE: dict[str, str] = {}


def mode_name(value: object) -> str:
    """The mode's name of a ``job.mode`` value (a name or ``{name: ..., knobs}``)."""
    if isinstance(value, Mapping):
        name = value.get("name")
        if not isinstance(name, str):
            raise ConfigError(
                f"job.mode: a mapping needs 'name' (one of {_names()}), got {dict(value)!r}"
            )
        return name
    if not isinstance(value, str):
        raise ConfigError(
            f"job.mode: expected a mode name ({_names()}) or a mapping "
            f"{{name: ..., knob: value}}, got {value!r}"
        )
    return value


def mode_from_config(value: object) -> Mode:
    """The :class:`~sparseps.Mode` of a ``job.mode`` value.

    Raises:
        ConfigError: an unknown name, a mode online jobs do not run, or a knob the mode
            does not have or does not accept (the mode's own message).
    """
    name = mode_name(value)
    if name in NOT_ONLINE:
        raise ConfigError(f"job.mode {name}: {NOT_ONLINE[name]}")
    mode = Strategy.from_dict({"mode": value}, where="job").mode  # the library's parser
    assert mode is not None
    return mode


def deterministic(mode: Mode) -> bool:
    """Whether a crash and rerun gives the uninterrupted run's model bit for bit: the
    result of every step depends on the data alone, not on timing (sync mode, not with
    backup workers, which drop whichever gradients come last; heter in sync mode)."""
    if mode.name in ("sync", "gpups"):  # gpups: sync's lock-step on device tables
        return not getattr(mode, "backup_workers", 0)
    return mode.name == "heter" and bool(getattr(mode, "sync", False))


def _names() -> tuple[str, ...]:
    return tuple(n for n in MODES if n not in NOT_ONLINE)
