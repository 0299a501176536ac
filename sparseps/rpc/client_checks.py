"""Validation of the arrays handed to :class:`~sparseps.rpc.client.PSClient` (the public boundary).

Each check raises :class:`~sparseps.errors.InputError` naming the call, the argument,
what was expected and what was found. Pushes are checked completely here, before
anything is sent: a push split over several servers must be applied by all of them or by
none, and a server that rejected its part could not undo the others' (the tables would
then disagree with any single-table replay of the same pushes).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

__all__ = ["check_counts_or_none", "check_finite_rows", "check_finite_vector", "check_merged"]

_REJECTED = "the whole push is rejected and nothing was sent to any server"


def _found(values) -> str:
    if isinstance(values, np.ndarray):
        return f"{values.dtype} array of shape {values.shape}"
    return type(values).__name__


def check_finite_rows(values, name: str, what: str, n: int) -> np.ndarray:
    """float32 ``[n, dim]`` with no NaN/inf (the error names the first bad row/column)."""
    if (
        not isinstance(values, np.ndarray)
        or values.dtype != np.float32
        or values.ndim != 2
        or len(values) != n
    ):
        raise InputError(
            f"{what}: {name} must be a float32 array of shape [{n}, dim] (one row per key), "
            f"got {_found(values)}"
        )
    bad = ~np.isfinite(values)
    if bad.any():
        # argmax of the flattened mask: the first bad value in C order, without a loop.
        row, column = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise InputError(
            f"{what}: {name} must be finite; {int(bad.sum())} NaN/inf value(s), first "
            f"{float(values[row, column])!r} at {name}[{row}, {column}]; {_REJECTED}"
        )
    return values


def check_counts_or_none(values, name: str, what: str, n: int) -> np.ndarray | None:
    """Shows or clicks: None (stays None: the servers fill their defaults), or a finite,
    non-negative float32 ``[n]``.

    The servers refuse the same values, but only for their own keys; checking here keeps
    a bad count from being applied by some servers and not others.
    """
    if values is None:
        return None
    if not isinstance(values, np.ndarray) or values.dtype != np.float32 or values.shape != (n,):
        raise InputError(
            f"{what}: {name} must be a float32 array of shape [{n}] or None, got {_found(values)}"
        )
    # NaN fails both comparisons, so one mask catches NaN, inf and negatives.
    bad = ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        first = int(np.argmax(bad))
        raise InputError(
            f"{what}: {name} must be finite and >= 0; {int(bad.sum())} bad value(s), first "
            f"{float(values[first])!r} at {name}[{first}]; {_REJECTED}"
        )
    return values


def check_merged(
    what: str, keys: np.ndarray, values: np.ndarray, shows: np.ndarray, clicks: np.ndarray
) -> None:
    """After duplicates were summed: finite inputs can still overflow float32 to inf.

    Args:
        what: the call, for the message.
        keys: the unique keys, in the order of the merged rows.
        values, shows, clicks: the merged rows and counts.

    Raises:
        InputError: naming the first key whose merged row or counts are not finite.
    """
    bad = ~np.isfinite(values).all(axis=1) | ~np.isfinite(shows) | ~np.isfinite(clicks)
    if bad.any():
        first = int(np.argmax(bad))
        raise InputError(
            f"{what}: the summed gradients or counts of duplicate key {int(keys[first])} "
            f"overflow float32 (inf); scale them down; {_REJECTED}"
        )


def check_finite_vector(values, what: str) -> np.ndarray:
    """A 1-D float32 array of any length with no NaN/inf, made contiguous (dense values).

    Unlike the table's ``check_contiguous_vector`` (exact length and layout, values not
    looked at), this checks the values: a bad one is refused before anything is sent.
    """
    if not isinstance(values, np.ndarray) or values.dtype != np.float32 or values.ndim != 1:
        raise InputError(f"{what}: expected a 1-D float32 array, got {_found(values)}")
    if not np.isfinite(values).all():  # one pass over a clean vector (every dense step)
        bad = ~np.isfinite(values)
        first = int(np.argmax(bad))
        raise InputError(
            f"{what}: {int(bad.sum())} NaN/inf value(s), first {float(values[first])!r} at index "
            f"{first}; rejected, nothing was sent"
        )
    return np.ascontiguousarray(values)
