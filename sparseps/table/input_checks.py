"""Validation at the table's public entry points.

Compiled kernels assume valid input; these checks make sure they get it and, when not,
raise :class:`~sparseps.errors.InputError` naming the call, the argument, what was
expected and what was found. Arrays are never silently converted: a float64 gradient or
an int64 key array is a bug in the caller (and a silent copy would hide a slow path).
"""

from __future__ import annotations

from typing import NoReturn

import numpy as np

from ..core.jit import njit
from ..core.validate import check_key_array, describe_array
from ..errors import InputError

__all__ = [
    "check_contiguous_vector",
    "check_finite",
    "check_key_array",
    "check_matrix",
    "counts_or_default",
]


@njit(nogil=True, cache=True)
def any_nonfinite(bits):  # pragma: no cover - compiled
    """Whether a float32 array, seen as its ``uint32`` bits, holds a NaN or inf."""
    # NaN/inf <=> all exponent bits set <=> (bits & 0x7F800000) + 0x00800000 has bit 31:
    # an integer OR-reduction, which LLVM vectorises (a float test per element does not;
    # np.isfinite(...).all() also writes a bool temporary of the batch's size)
    flags = np.uint32(0)
    for i in range(bits.shape[0]):
        flags |= (bits[i] & np.uint32(0x7F800000)) + np.uint32(0x00800000)
    return (flags & np.uint32(0x80000000)) != 0


@njit(nogil=True, cache=True)
def _counts_ok(values):  # pragma: no cover - compiled
    ok = True
    for i in range(values.shape[0]):
        x = values[i]
        ok &= (x >= 0.0) & (x <= _F32_MAX)  # False for NaN, inf and negatives
    return ok


_F32_MAX = float(np.finfo(np.float32).max)
# read-only default counts (1 show, 0 clicks a key), grown as batches grow: a push that
# sends no counts does not fill two fresh arrays of its batch's size
_DEFAULTS: dict[float, np.ndarray] = {}


def _default_counts(default: float, n: int) -> np.ndarray:
    values = _DEFAULTS.get(default)
    if values is None or values.shape[0] < n:
        values = np.full(max(n, 2 * (0 if values is None else values.shape[0])), default,
                         np.float32)  # fmt: skip
        values.flags.writeable = False
        _DEFAULTS[default] = values
    return values[:n]


def _fail(op: str, name: str, expected: str, array: object, fix: str = "") -> NoReturn:
    hint = f"; {fix}" if fix else ""
    raise InputError(f"{op}: {name} must be {expected}, found {describe_array(array)}{hint}")


def check_matrix(op: str, name: str, values: object, rows: int, dim: int) -> np.ndarray:
    """A C-contiguous float32 ``[rows, dim]`` array, else InputError."""
    expected = f"a C-contiguous float32 array of shape ({rows}, {dim})"
    if not isinstance(values, np.ndarray) or values.dtype != np.float32:
        _fail(op, name, expected, values, "convert with np.ascontiguousarray(x, dtype=np.float32)")
    if values.shape != (rows, dim):
        _fail(op, name, expected, values)
    if not values.flags.c_contiguous:
        _fail(op, name, expected, values, "pass np.ascontiguousarray(x)")
    return values


def check_contiguous_vector(op: str, name: str, values: object, n: int, dtype) -> np.ndarray:
    """A C-contiguous 1-D ``dtype`` array of length ``n``, else InputError."""
    if not isinstance(values, np.ndarray) or values.dtype != dtype or values.shape != (n,):
        _fail(op, name, _vector_of(dtype, n), values)
    if not values.flags.c_contiguous:
        _fail(op, name, _vector_of(dtype, n), values, "pass np.ascontiguousarray(x)")
    return values


def _vector_of(dtype, n: int) -> str:
    # only on failure: naming a dtype costs more than the checks (this runs every push)
    return f"a C-contiguous 1-D {np.dtype(dtype)} array of length {n}"


def counts_or_default(op: str, name: str, values: object, n: int, default: float) -> np.ndarray:
    """Shows or clicks: None -> ``default`` per key; else finite, >= 0 float32 ``[n]``.

    The table's side of the client's ``check_counts_or_none``: here None becomes the
    default counts the push applies.
    """
    if values is None:
        return _default_counts(default, n)
    values = check_contiguous_vector(op, name, values, n, np.float32)
    if _counts_ok(values):
        return values
    bad = ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        raise InputError(
            f"{op}: {name} must be finite and >= 0, found {int(bad.sum())} bad value(s), "
            f"first {values[bad][0]!r} at position {int(np.flatnonzero(bad)[0])}"
        )
    return values


def check_finite(op: str, name: str, values: np.ndarray, keys: np.ndarray) -> None:
    """Reject the whole batch if any value is NaN or inf (names the count and first key)."""
    if values.dtype == np.float32 and values.flags.c_contiguous:
        if not any_nonfinite(values.reshape(-1).view(np.uint32)):
            return
    elif np.isfinite(values).all():
        return
    bad = ~np.isfinite(values)
    rows = np.flatnonzero(bad.reshape(values.shape[0], -1).any(axis=1))
    raise InputError(
        f"{op}: {name} contain {int(bad.sum())} NaN/inf value(s) in {rows.size} row(s), first at "
        f"key {int(keys[rows[0]])} (position {int(rows[0])}); the whole batch was rejected and "
        "the table is unchanged"
    )
