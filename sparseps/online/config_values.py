"""Value checks of the online config: each raises a ``ConfigError`` naming ``section.key``.

Kept apart from :mod:`sparseps.online.config` so the dataclasses there read as the
list of settings they are.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from ..errors import ConfigError

__all__ = [
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "check_str",
    "parse_day",
    "reject_unknown",
]


def check_int(where: str, value: Any, lo: int, hi: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ConfigError(f"{where}: expected an integer {bound}, got {value!r}")
    return value


def check_float(
    where: str, value: Any, lo: float, hi: float | None = None, *, open_lo: bool = False
) -> float:
    """A finite number in the range: ``inf`` and ``nan`` are refused for every setting
    (YAML reads ``.inf``/``.nan``; an infinite timeout is a wait that never ends, and a
    check like ``value > 0`` alone lets it through)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = (
            math.isfinite(value)
            and (value > lo if open_lo else value >= lo)
            and (hi is None or value <= hi)
        )
    if not ok:
        low = f"> {lo}" if open_lo else f">= {lo}"
        bound = f"{low} and <= {hi}" if hi is not None else low
        raise ConfigError(f"{where}: expected a finite number {bound}, got {value!r}")
    return value


def check_str(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def check_bool(where: str, value: Any) -> bool:
    # YAML reads yes/no/true/false as bools; a quoted "true" or 1 is a mistake worth naming
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def check_choice(where: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: expected one of {', '.join(choices)}; got {value!r}")
    return value


def parse_day(where: str, value: Any) -> dt.date:
    """``YYYYMMDD`` (a string, or an int YAML read from unquoted digits) as a date."""
    text = str(value)
    try:
        if isinstance(value, bool) or len(text) != 8 or not text.isdigit():
            raise ValueError
        return dt.datetime.strptime(text, "%Y%m%d").date()
    except ValueError:
        raise ConfigError(
            f"{where}: expected a day as YYYYMMDD (e.g. '20240101'), got {value!r}"
        ) from None


def reject_unknown(raw: dict, accepted: dict[str, list[str]]) -> None:
    """Raise one ``ConfigError`` naming every unknown section and ``section.key`` of ``raw``.

    All of them at once: fixing a config one typo per run is slow when a file was written
    for another version.
    """
    unknown_sections = sorted(str(name) for name in raw if name not in accepted)
    unknown_keys = [
        f"{name}.{key}"
        for name, keys in accepted.items()
        if isinstance(raw.get(name), dict)
        for key in raw[name]
        if key not in keys
    ]
    problems = []
    if unknown_sections:
        problems.append(
            f"unknown section{'s' if len(unknown_sections) > 1 else ''} "
            f"{', '.join(repr(s) for s in unknown_sections)} (accepted: {', '.join(accepted)})"
        )
    for where in unknown_keys:
        name = where.split(".", 1)[0]
        problems.append(f"{where}: unknown key (accepted in {name}: {', '.join(accepted[name])})")
    if problems:
        raise ConfigError("; ".join(problems))
