"""Compiled readers of one slot-text token, each reading its bytes once (inlined into
:func:`sparseps.data.slot_text._parse`).

A token ends at a space, a tab, the newline, or the ``\\r`` of a ``\\r\\n`` (or of a last
line without newline); a ``\\r`` elsewhere is part of the token. Each reader gives the
verdict and value of the :mod:`~sparseps.data.numbers` parser on the same byte range:
these only spare the second pass over the bytes that finding the end first would take.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit
from .numbers import parse_float

__all__ = ["ends_token", "read_id", "read_number", "same_bytes", "token_end"]


@njit(nogil=True, cache=True, inline="always")
def ends_token(data, i, n):
    """Whether ``data[i]`` ends a token."""
    c = data[i]
    return c == 32 or c == 9 or c == 10 or (c == 13 and (i + 1 == n or data[i + 1] == 10))


@njit(nogil=True, cache=True, inline="always")
def token_end(data, i, n):
    """The end of the token that ``data[i]`` is in (or ``i`` when it ends one)."""
    while i < n and not ends_token(data, i, n):
        i += 1
    return i


@njit(nogil=True, cache=True, inline="always")
def same_bytes(data, a, b, width):
    for j in range(width):  # noqa: SIM110 - a loop numba compiles (not a generator)
        if data[a + j] != data[b + j]:
            return False
    return True


@njit(nogil=True, cache=True, inline="always")
def read_id(data, s, n):
    """The id from ``data[s]`` to the token's end: ``(ok, id, end)``, ``ok`` as
    :func:`~sparseps.data.numbers.parse_uint64` of that range."""
    value = np.uint64(0)
    i = s
    ok = True
    while i < n:
        c = data[i]
        if 48 <= c <= 57:
            value = value * np.uint64(10) + np.uint64(c - 48)
        elif ends_token(data, i, n):
            break
        else:
            ok = False
        i += 1
    # 19 digits always fit in 64 bits; 20 may (parse_uint64's exact check), 21 never
    if i - s > 19 and ok:
        limit = np.uint64(1844674407370955161)  # (2**64 - 1) // 10
        value = np.uint64(0)
        for j in range(s, i):
            d = np.uint64(data[j] - 48)
            if value > limit or (value == limit and d > np.uint64(5)):
                ok = False
                break
            value = value * np.uint64(10) + d
    return ok and i > s, value, i


@njit(nogil=True, cache=True, inline="always")
def read_number(data, s, n, pow10):
    """The number from ``data[s]`` to the token's end: ``(ok, value, end)``, the result of
    :func:`~sparseps.data.numbers.parse_float` on that range.

    ``-?digits`` of at most 16 characters and ``-?digits.digits`` of at most 18 digits
    (nearly every value of a click log) are read here in one pass, by parse_float's own
    fast paths' arithmetic; anything else goes to parse_float itself.
    """
    i = s
    neg = i < n and data[i] == 45
    if neg:
        i += 1
    v = 0
    digits = 0
    while i < n and digits < 18:
        c = data[i]
        if c < 48 or c > 57:
            break
        v = v * 10 + (c - 48)
        digits += 1
        i += 1
    if digits > 0 and (i == n or ends_token(data, i, n)) and i - s <= 16:
        return True, float(-v if neg else v), i
    if digits > 0 and i < n and data[i] == 46:
        i += 1
        f = 0
        while i < n and digits + f < 18:
            c = data[i]
            if c < 48 or c > 57:
                break
            v = v * 10 + (c - 48)
            f += 1
            i += 1
        if f > 0 and (i == n or ends_token(data, i, n)):
            value = float(v) / pow10[f]
            return True, -value if neg else value, i
    e = token_end(data, i, n)
    ok, x = parse_float(data, s, e, pow10)
    return ok, x, e
