"""The floating-point model of the rule kernels: total over finite input.

Every rule kernel follows the same three rules, so that a push of finite gradients never
fails and never writes a NaN or an infinity (issue 28):

1. **float64 inside, float32 outside.** Rows are stored as float32, but each kernel
   reads them into float64 and does all its arithmetic there (parameters are float64
   too). With stored values, gradients and parameters bounded by float32's max
   (~3.4e38, see :data:`F32_MAX`; parameters are refused above it when the rule is
   made), no intermediate can overflow float64 (products stay below ~1e160) and
   ``g*g`` of a float32 subnormal is still > 0 (float64 reaches 1e-308).
2. **Saturating stores.** A result is written back through :func:`fit32`, which clamps
   it to ``[-F32_MAX, F32_MAX]``: a value that float32 cannot hold is stored as the
   largest one that it can, instead of +-inf. (A NaN is passed through on purpose: it
   cannot arise from finite input, and if it ever did the table's finiteness check
   rejects the whole push.)
3. **Guards where the maths needs them**: denominators that can be zero (FTRL with
   ``beta = 0`` and ``n = 0``) and state that must be >= 0 (accumulators, FTRL's ``n``,
   Adam's step counter: a foreign checkpoint could hold a negative one).

Error model: kernels are compiled with numba's ``error_model="numpy"`` (:data:`KERNEL`),
so a float division by zero gives inf/NaN like numpy instead of raising
``ZeroDivisionError`` in the middle of a batch (numba's default "python" model; the
cause of issue 28). With the guards no division by zero is reachable; the numpy model
also drops the per-division zero test, which lets LLVM vectorise the loops. Whatever
still goes wrong is caught by the table's check of every written value (the last line
of defence): the push is rejected whole and the table restored.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import numpy as np

from ..core.jit import njit

__all__ = ["F32_MAX", "F32_TINY", "KERNEL", "fit32"]

#: the largest finite float32 (3.4028235e38)
F32_MAX = float(np.finfo(np.float32).max)
#: the smallest normal float32 (1.1754944e-38)
F32_TINY = float(np.finfo(np.float32).tiny)


class _KernelOptions(TypedDict):
    """The keyword arguments of ``numba.njit`` that :data:`KERNEL` sets (typed for mypy)."""

    nogil: bool
    cache: bool
    error_model: Literal["python", "numpy"]


#: numba options of every rule kernel
KERNEL: _KernelOptions = {"nogil": True, "cache": True, "error_model": "numpy"}


@njit(nogil=True, cache=True, inline="always")
def fit32(x):  # pragma: no cover - compiled
    """``x`` clamped to the finite float32 range (NaN passes through unchanged)."""
    if x > F32_MAX:
        return F32_MAX
    if x < -F32_MAX:
        return -F32_MAX
    return x


@njit(nogil=True, cache=True, inline="always")
def settle_weight(w, clip, low, high):  # pragma: no cover - compiled
    """The value a rule stores for a new weight ``w``: clipped to ``[low, high]`` when
    ``clip``, then to the finite float32 range (the one saturating store of every rule)."""
    if clip:
        w = min(max(w, low), high)
    return fit32(w)
