"""Value checks of the online config: each raises a ``ConfigError`` naming ``section.key``.

Besides plain values: ``module:attribute`` references (``model.builder``, ``model.loss``:
checked at load, imported only by the job that uses them) and Ray resource mappings
(``job.*_resources``).

Kept apart from the section modules (``config_job``, ``config_data``, ``config_model``,
``config_schedule``) so their dataclasses read as the list of settings they are.
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
    "check_ref",
    "check_resources",
    "check_str",
    "parse_day",
    "reject_unknown",
    "resolve_ref",
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


def check_ref(name: str, value: object) -> str:
    """A ``module:attribute`` reference (imported by the job, not here)."""
    text = check_str(name, value)
    module, _, attribute = text.partition(":")
    if (
        not module
        or not attribute
        or not all(part.isidentifier() for part in (*module.split("."), *attribute.split(".")))
    ):
        raise ConfigError(f"{name}: expected 'package.module:function', got {value!r}")
    return text


def resolve_ref(name: str, ref: str):
    """The object ``module:attribute`` names; ConfigError naming ``name`` if it cannot."""
    import importlib

    module, _, attribute = ref.partition(":")
    try:
        value = importlib.import_module(module)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{name}: cannot import {ref!r} ({type(exc).__name__}: {exc})") from None
    return value


def check_resources(where: str, value: object) -> dict[str, float]:
    """Ray resources: a mapping of resource names to amounts > 0 (``{CPU: 2, GPU: 1}``)."""
    import json

    from ..launch.ray_placement import parse_resources

    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of Ray resources such as "
                          f"{{CPU: 2, GPU: 1}}, got {value!r}")  # fmt: skip
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # a value YAML made that JSON cannot hold
        raise ConfigError(f"{where}: expected resource amounts > 0, got {value!r}") from None
    return parse_resources(where, text)
