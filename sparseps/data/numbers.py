"""Compiled parsing of decimal numbers from byte ranges (used inside the parser kernels).

``parse_float`` reads ``[+-]digits[.digits][(e|E)[+-]digits]`` (the grammar of arrow's
string-to-float cast, without ``nan``/``inf``) and rejects anything else or a
non-finite result; plain integers take a fast path. ``parse_uint64`` reads an unsigned
decimal integer that fits in 64 bits.
"""

from __future__ import annotations

import numpy as np

from ..core.jit import njit

__all__ = ["POW10", "parse_decimal", "parse_float", "parse_uint64"]

POW10 = np.array([10.0**i for i in range(23)])


@njit(nogil=True, cache=True, inline="always")
def parse_float(data, s, e, pow10):
    """Decimal text ``data[s:e]`` -> (ok, float64). Exact for up to 15 significant digits."""
    # fast path: a plain integer (most dense values in click logs are counts)
    i = s
    if i < e and data[i] == 45:
        i += 1
    v = 0
    while i < e and i - s < 16:
        c = data[i]
        if c < 48 or c > 57:
            break
        v = v * 10 + (c - 48)
        i += 1
    if i == e and e > s and data[e - 1] != 45:
        return True, float(-v if data[s] == 45 else v)
    # second fast path: ``-?digits.digits`` with at most 18 digits in all, which
    # parse_decimal would read into the same integer mantissa and divide by the same
    # power of ten (so the value is the same, bit for bit), in this single pass
    if i < e and data[i] == 46 and i > s and data[i - 1] != 45:
        ndig = i - s - (1 if data[s] == 45 else 0)
        i += 1
        f = 0
        while i < e and ndig + f < 18:
            c = data[i]
            if c < 48 or c > 57:
                break
            v = v * 10 + (c - 48)
            f += 1
            i += 1
        if i == e and f > 0:
            value = float(v) / pow10[f]
            return True, -value if data[s] == 45 else value
    return parse_decimal(data, s, e, pow10)


@njit(nogil=True, cache=True)
def parse_decimal(data, s, e, pow10):
    """The general decimal parser behind :func:`parse_float`."""
    i = s
    neg = False
    if i < e and (data[i] == 45 or data[i] == 43):  # '-' '+'
        neg = data[i] == 45
        i += 1
    mant = np.uint64(0)
    ndig = 0
    exp10 = 0
    digits = 0
    while i < e and 48 <= data[i] <= 57:
        d = data[i] - 48
        digits += 1
        if ndig < 19:
            if mant > 0 or d > 0:
                ndig += 1
            mant = mant * np.uint64(10) + np.uint64(d)
        else:
            exp10 += 1
        i += 1
    if i < e and data[i] == 46:  # '.'
        i += 1
        while i < e and 48 <= data[i] <= 57:
            d = data[i] - 48
            digits += 1
            if ndig < 19:
                if mant > 0 or d > 0:
                    ndig += 1
                mant = mant * np.uint64(10) + np.uint64(d)
                exp10 -= 1
            i += 1
    if digits == 0:
        return False, 0.0
    if i < e and (data[i] == 101 or data[i] == 69):  # 'e' 'E'
        i += 1
        eneg = False
        if i < e and (data[i] == 45 or data[i] == 43):
            eneg = data[i] == 45
            i += 1
        if i >= e:
            return False, 0.0
        ex = 0
        while i < e and 48 <= data[i] <= 57:
            if ex < 100000:
                ex = ex * 10 + (data[i] - 48)
            i += 1
        exp10 += -ex if eneg else ex
    if i != e:
        return False, 0.0
    value = float(mant)
    # Clinger's fast path: exact when the mantissa and the power of ten are exact doubles.
    if 0 <= exp10 <= 22:
        value = value * pow10[exp10]
    elif -22 <= exp10 < 0:
        value = value / pow10[-exp10]
    else:
        value = value * 10.0**exp10
    if not np.isfinite(value):
        return False, 0.0
    return True, -value if neg else value


@njit(nogil=True, cache=True)
def parse_uint64(data, s, e):
    if s >= e:
        return False, np.uint64(0)
    value = np.uint64(0)
    limit = np.uint64(1844674407370955161)  # (2**64 - 1) // 10
    for i in range(s, e):
        c = data[i]
        if c < 48 or c > 57:
            return False, np.uint64(0)
        d = np.uint64(c - 48)
        if value > limit or (value == limit and d > np.uint64(5)):
            return False, np.uint64(0)
        value = value * np.uint64(10) + d
    return True, value
