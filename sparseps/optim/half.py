"""float16 storage of weights: IEEE half bits in ``uint16``, converted in the kernels.

numba has no float16 arithmetic on the CPU, so weights stored as halves are read with
:func:`half_to_float` and written with :func:`float_to_half` (round to nearest, ties to
even, like numpy's ``astype(np.float16)`` of a float64). Stores saturate at the largest
finite half (65504) instead of becoming infinite, as the float32 rules saturate at
float32's max (:mod:`.numerics`); a weight's steps smaller than half its spacing
(2**-11 of its size) are lost to the rounding.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.jit import njit

__all__ = ["HALF_MAX", "float_to_half", "half_to_float", "halves_to_floats", "floats_to_halves"]

#: the largest finite float16
HALF_MAX = 65504.0


@njit(nogil=True, cache=True, inline="always")
def half_to_float(h):  # pragma: no cover - compiled
    """The float64 value of the half whose bits are ``h`` (finite halves only)."""
    bits = np.int64(h)
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    if exponent == 0:
        value = math.ldexp(np.float64(mantissa), -24)
    else:
        value = math.ldexp(np.float64(mantissa + 1024), exponent - 25)
    return -value if bits & 0x8000 else value


@njit(nogil=True, cache=True, inline="always")
def float_to_half(x):  # pragma: no cover - compiled
    """The bits (uint16) of ``x`` rounded to the nearest half, ties to even; saturated at
    +-65504 (a NaN becomes 0x7E00, a NaN half: the caller's finiteness check sees it)."""
    if x != x:
        return np.uint16(0x7E00)
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a >= HALF_MAX:
        return np.uint16(sign | 0x7BFF)
    if a < 6.103515625e-05:  # below the smallest normal: a multiple of 2**-24
        m = np.int64(np.rint(a * 16777216.0))  # m == 1024 is the smallest normal's bits
        return np.uint16(sign | m)
    frac, e = math.frexp(a)  # a = frac * 2**e, frac in [0.5, 1)
    m = np.int64(np.rint((frac * 2.0 - 1.0) * 1024.0))
    exponent = e - 1 + 15
    if m == 1024:
        m = 0
        exponent += 1
    if exponent >= 31:
        return np.uint16(sign | 0x7BFF)
    return np.uint16(sign | (exponent << 10) | m)


@njit(nogil=True, cache=True)
def halves_to_floats(halves, out):  # pragma: no cover - compiled
    """``out[i, j] = half_to_float(halves[i, j])`` for ``out``'s columns."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = half_to_float(halves[i, j])


@njit(nogil=True, cache=True)
def floats_to_halves(values, out):  # pragma: no cover - compiled
    """``out[i, j] = float_to_half(values[i, j])`` for ``values``' columns."""
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            out[i, j] = float_to_half(np.float64(values[i, j]))
