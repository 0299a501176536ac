"""Validation of the arrays handed to :class:`~sparseps.rpc.client.PSClient` (the public boundary).

Each check raises :class:`~sparseps.errors.InputError` naming the call, the argument,
what was expected and what was found.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

__all__ = ["check_counts", "check_keys", "check_rows", "check_vector"]


def check_keys(keys, what: str) -> np.ndarray:
    if not isinstance(keys, np.ndarray) or keys.dtype != np.uint64 or keys.ndim != 1:
        found = (
            f"{keys.dtype} array of shape {keys.shape}"
            if isinstance(keys, np.ndarray)
            else type(keys).__name__
        )
        raise InputError(
            f"{what}: keys must be a 1-D uint64 numpy array, got {found} (use keys.astype(np.uint64))"
        )
    return keys


def check_rows(values, name: str, what: str, n: int) -> np.ndarray:
    if (
        not isinstance(values, np.ndarray)
        or values.dtype != np.float32
        or values.ndim != 2
        or len(values) != n
    ):
        found = (
            f"{values.dtype} array of shape {values.shape}"
            if isinstance(values, np.ndarray)
            else type(values).__name__
        )
        raise InputError(
            f"{what}: {name} must be a float32 array of shape [{n}, dim] (one row per key), got {found}"
        )
    bad = ~np.isfinite(values)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise InputError(
            f"{what}: {name} has {int(bad.sum())} NaN/inf values (first at row {int(rows[0])}); "
            "the whole push is rejected so no server applies part of it"
        )
    return values


def check_counts(values, name: str, what: str, n: int) -> np.ndarray | None:
    if values is None:
        return None
    if not isinstance(values, np.ndarray) or values.dtype != np.float32 or values.shape != (n,):
        found = (
            f"{values.dtype} array of shape {values.shape}"
            if isinstance(values, np.ndarray)
            else type(values).__name__
        )
        raise InputError(
            f"{what}: {name} must be a float32 array of shape [{n}] or None, got {found}"
        )
    return values


def check_vector(values, what: str) -> np.ndarray:
    if not isinstance(values, np.ndarray) or values.dtype != np.float32 or values.ndim != 1:
        found = (
            f"{values.dtype} array of shape {values.shape}"
            if isinstance(values, np.ndarray)
            else type(values).__name__
        )
        raise InputError(f"{what}: expected a 1-D float32 array, got {found}")
    if not np.isfinite(values).all():
        raise InputError(f"{what}: {int((~np.isfinite(values)).sum())} NaN/inf values; rejected")
    return np.ascontiguousarray(values)
