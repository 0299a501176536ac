"""float16 storage of weights: IEEE half bits in ``uint16``, converted in the kernels.

numba has no float16 arithmetic on the CPU, so weights stored as halves are read with
:func:`half_to_float` (a table of exponents and one multiply) and written with
:func:`float_to_half` (integer arithmetic on the float64's bits: round to nearest, ties to
even, like numpy's ``astype(np.float16)`` of a float64). Stores saturate at the largest
finite half (65504) instead of becoming infinite, as the float32 rules saturate at
float32's max (:mod:`.numerics`); a weight's steps smaller than half its spacing
(2**-11 of its size) are lost to the rounding.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from ..core.jit import njit

__all__ = ["HALF_MAX", "float_to_half", "half_to_float", "halves_to_floats", "floats_to_halves"]

#: the largest finite float16
HALF_MAX = 65504.0


# 2**(e - 25) for a half's biased exponent e >= 1 (value = (1024 + m) * that), 2**-24 for
# e = 0 (subnormal: m * 2**-24): one multiply, exact
_SCALE = np.array([2.0**-24] + [2.0 ** (e - 25) for e in range(1, 32)], np.float64)


@intrinsic
def _f64_bits(typingctx, x):
    """The IEEE bits of a float64 as a uint64 (a bit cast, no conversion)."""
    if not isinstance(x, types.Float):
        return None
    sig = types.uint64(types.float64)

    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[0], signature.args[0], types.float64)
        return builder.bitcast(value, context.get_value_type(types.uint64))

    return sig, codegen


@njit(nogil=True, cache=True, inline="always")
def half_to_float(h):  # pragma: no cover - compiled
    """The float64 value of the half whose bits are ``h`` (finite halves only)."""
    bits = np.int64(h)
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    value = np.float64(mantissa + (1024 if exponent else 0)) * _SCALE[exponent]
    return -value if bits & 0x8000 else value


@njit(nogil=True, cache=True, inline="always")
def float_to_half(x):  # pragma: no cover - compiled
    """The bits (uint16) of float64 ``x`` rounded to the nearest half, ties to even
    (integer arithmetic on its bits: one rounding, as numpy's ``astype(np.float16)``);
    saturated at +-65504; a NaN becomes 0x7E00 (a NaN half: the caller's check sees it)."""
    u = _f64_bits(np.float64(x))
    sign = np.int64((u >> np.uint64(48)) & np.uint64(0x8000))
    e = np.int64((u >> np.uint64(52)) & np.uint64(0x7FF))
    m = np.int64(u & np.uint64(0xFFFFFFFFFFFFF))
    if e == 0x7FF:  # inf saturates, NaN stays NaN
        return np.uint16(0x7E00) if m else np.uint16(sign | 0x7BFF)
    exponent = e - 1023 + 15  # the half's biased exponent
    if exponent >= 31:
        return np.uint16(sign | 0x7BFF)
    if exponent <= 0:  # a half subnormal (or zero): units of 2**-24
        shift = 43 - exponent
        if e == 0 or shift > 62:
            return np.uint16(sign)
        full = m | (np.int64(1) << 52)
        q = full >> shift
        rest = full & ((np.int64(1) << shift) - 1)
        tie = np.int64(1) << (shift - 1)
        if rest > tie or (rest == tie and (q & 1)):
            q += 1  # 0x400 is the smallest normal's bits: right as it is
        return np.uint16(sign | q)
    q = m >> 42
    rest = m & ((np.int64(1) << 42) - 1)
    if rest > (np.int64(1) << 41) or (rest == (np.int64(1) << 41) and (q & 1)):
        q += 1  # a carry into the exponent is right too
    bits = (exponent << 10) + q
    if bits >= 0x7C00:
        return np.uint16(sign | 0x7BFF)
    return np.uint16(sign | bits)


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
