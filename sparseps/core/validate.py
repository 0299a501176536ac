"""Argument checks, one name per meaning.

- ``check_float`` / ``check_int`` / ``check_known_fields``: fields of config objects and
  optimizer rules (:class:`~sparseps.errors.ConfigError` naming ``owner.field``);
- ``check_key_array``: a batch of feature ids handed to a public entry point (a table,
  the client): a 1-D ``uint64`` numpy array (:class:`~sparseps.errors.InputError`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError

__all__ = ["check_float", "check_int", "check_key_array", "check_known_fields", "describe_array"]


def check_float(
    owner: str,
    name: str,
    value: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> float:
    """Return ``value`` as a finite float, or raise ConfigError naming ``owner.name``.

    Args:
        owner: the object being validated, e.g. ``"Adagrad"``.
        name: the field name.
        value: the value given.
        ge, gt, le, lt: optional bounds (inclusive / exclusive).

    Raises:
        ConfigError: not a real number, not finite, or out of bounds.
    """
    # bool is an int subclass; True as a learning rate is always a mistake.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(
            f"{owner}.{name}: expected a number, got {value!r} ({type(value).__name__})"
        )
    result = float(value)
    bounds = []
    if ge is not None:
        bounds.append((result >= ge, f">= {ge}"))
    if gt is not None:
        bounds.append((result > gt, f"> {gt}"))
    if le is not None:
        bounds.append((result <= le, f"<= {le}"))
    if lt is not None:
        bounds.append((result < lt, f"< {lt}"))
    wanted = " and ".join(text for _, text in bounds) or "finite"
    if not math.isfinite(result) or not all(ok for ok, _ in bounds):
        raise ConfigError(f"{owner}.{name}: got {value!r}, expected a finite number {wanted}")
    return result


def check_int(
    owner: str, name: str, value: Any, *, ge: int | None = None, le: int | None = None
) -> int:
    """Return ``value`` as an int within ``[ge, le]`` or raise ConfigError naming the field."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(
            f"{owner}.{name}: expected an integer, got {value!r} ({type(value).__name__})"
        )
    number = int(value)
    if (ge is not None and number < ge) or (le is not None and number > le):
        low = "-inf" if ge is None else ge
        high = "inf" if le is None else le
        raise ConfigError(f"{owner}.{name}: got {value}, expected an integer in [{low}, {high}]")
    return number


def check_known_fields(owner: str, given: Mapping, allowed: set[str] | tuple[str, ...]) -> None:
    """Reject a dict that is not a mapping or carries keys the object does not know."""
    if not isinstance(given, Mapping):
        raise ConfigError(f"{owner}: expected a dict, got {type(given).__name__}")
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(f"{owner}: unknown key(s) {unknown}; accepted keys are {sorted(allowed)}")


def describe_array(array: object) -> str:
    """``dtype ..., shape ..., C-contiguous`` of an array, or the type of anything else."""
    if not isinstance(array, np.ndarray):
        return f"a {type(array).__name__}"
    layout = "C-contiguous" if array.flags.c_contiguous else "non-contiguous"
    return f"dtype {array.dtype}, shape {array.shape}, {layout}"


def check_key_array(
    op: str, keys: object, *, name: str = "keys", contiguous: bool = True
) -> np.ndarray:
    """``keys`` if it is a 1-D uint64 numpy array (C-contiguous when asked), else InputError.

    Args:
        op: the call, first words of the message (e.g. ``"pull 'emb'"``).
        keys: what the caller passed.
        name: the argument's name in the message.
        contiguous: also require C order (compiled kernels index the buffer directly).

    Raises:
        InputError: naming the call, the argument, what was expected and what was found.
    """
    expected = ("a C-contiguous " if contiguous else "a ") + "1-D uint64 numpy array"
    if not isinstance(keys, np.ndarray) or keys.dtype != np.uint64 or keys.ndim != 1:
        fix = "convert with np.ascontiguousarray(keys, dtype=np.uint64)"
    elif contiguous and not keys.flags.c_contiguous:
        fix = "pass np.ascontiguousarray(keys)"
    else:
        return keys
    raise InputError(f"{op}: {name} must be {expected}, found {describe_array(keys)}; {fix}")
