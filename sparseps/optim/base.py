"""The small protocol every server-side optimizer rule follows.

A rule is a frozen, validated dataclass. It says how many float32 state values a row of
width ``dim`` needs (``state_dim``), what they start at (``initial_state``) and how to
update a batch of rows in place (``update``). Rows live in one float32 matrix whose
columns are ``[embedding (dim) | state (state_dim) | ...]`` (see
``sparseps.table.RowLayout``), so a rule never needs to know about keys, admission or
statistics: it gets the matrix, the row indices and the merged gradients.

The update kernels are compiled with numba and make one pass over the touched rows;
they assume valid input (unique row indices, finite float32 gradients of the right
shape) because the table validates at its public entry points. They are *total* over
that input: no exception, and finite weights and state whatever the gradients' size
(float64 arithmetic, saturating float32 stores, guards: :mod:`.numerics`). Parameters
are refused when the rule is made if they cannot work (:func:`check_scale`,
:func:`check_nonnegative`, and per-rule combinations).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, ClassVar

import numpy as np

from ..core.validate import check_float, check_known_fields
from ..errors import ConfigError
from .numerics import F32_MAX, F32_TINY

__all__ = [
    "RULES",
    "Rule",
    "check_nonnegative",
    "check_scale",
    "clip_args",
    "register",
    "rule_from_dict",
]

RULES: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: make a rule constructible by name in :func:`rule_from_dict`."""
    RULES[cls.name] = cls
    return cls


class Rule:
    """Base class of the optimizer rules (subclasses are frozen dataclasses).

    Subclasses set ``name`` and implement ``state_columns`` and ``update``. Every rule has
    ``l2`` (added to the gradient as ``l2 * w`` before the update, like torch's
    ``weight_decay``; FTRL uses it as its own L2 term) and ``clip`` (``None`` or
    ``(min_bound, max_bound)`` applied to the weights after the update).
    """

    name: ClassVar[str] = ""

    # -- layout ---------------------------------------------------------------------------
    def state_columns(self, dim: int) -> tuple[tuple[str, int], ...]:
        """Names and widths of the per-row state columns, in storage order."""
        raise NotImplementedError

    def state_dim(self, dim: int) -> int:
        """Number of float32 state values per row of width ``dim``."""
        return sum(width for _, width in self.state_columns(dim))

    def initial_state(self, dim: int) -> np.ndarray:
        """The state of a new row: float32 ``[state_dim]`` (zeros unless overridden)."""
        return np.zeros(self.state_dim(dim), np.float32)

    # -- math -----------------------------------------------------------------------------
    def update(
        self, storage: np.ndarray, rows: np.ndarray, grads: np.ndarray, dim: int
    ) -> bool | None:
        """Apply one step to ``storage[rows]`` in place.

        Must be total over finite input: no exception, finite results (see
        :mod:`.numerics`). Returns whether every value it wrote is finite (the built-in
        kernels check that on the fly, in registers); ``None`` if the rule does not
        check, in which case the table checks the written rows itself.

        Args:
            storage: float32 ``[R, width]``, C-contiguous; columns ``[0, dim)`` are the
                embedding and ``[dim, dim + state_dim)`` the state.
            rows: int64 ``[u]`` unique row indices.
            grads: float32 ``[u, dim]`` C-contiguous, the merged gradient of each row.
            dim: the embedding width.
        """
        raise NotImplementedError

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict:
        """``{"name": rule name, <field>: value ...}`` with plain values (clip as a list)."""
        d: dict[str, Any] = {"name": self.name}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            d[f.name] = list(value) if isinstance(value, tuple) else value
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Rule:
        allowed = {f.name for f in fields(cls)} | {"name"}  # type: ignore[arg-type]
        check_known_fields(cls.__name__, d, allowed)
        kwargs = {k: v for k, v in d.items() if k != "name"}
        return cls(**kwargs)


def rule_from_dict(d: Mapping) -> Rule:
    """Rebuild a rule from :meth:`Rule.to_dict` output.

    Raises:
        ConfigError: not a dict, no ``name``, an unknown rule name, or an unknown key.
    """
    if isinstance(d, Rule):
        return d
    if not isinstance(d, Mapping):
        raise ConfigError(f"optimizer rule: expected a dict, got {type(d).__name__}")
    name = d.get("name")
    if name not in RULES:
        raise ConfigError(f"optimizer rule: unknown name {name!r}; known rules are {sorted(RULES)}")
    return RULES[name].from_dict(d)


def normalise_clip(owner: str, clip: Any) -> tuple[float, float] | None:
    """Validate ``clip`` (None or a pair min < max) and return it as a tuple of floats."""
    if clip is None:
        return None
    if not isinstance(clip, list | tuple) or len(clip) != 2:
        raise ConfigError(f"{owner}.clip: got {clip!r}, expected None or (min_bound, max_bound)")
    low = check_float(owner, "clip[0]", clip[0])
    high = check_float(owner, "clip[1]", clip[1])
    if not low < high:
        raise ConfigError(f"{owner}.clip: min_bound {low} must be < max_bound {high}")
    return (low, high)


def clip_args(clip: tuple[float, float] | None) -> tuple[float, float, bool]:
    """``(low, high, enabled)`` scalars for the compiled kernels."""
    if clip is None:
        return 0.0, 0.0, False
    return clip[0], clip[1], True


def check_scale(owner: str, name: str, value: Any) -> float:
    """A learning rate or similar scale: a float in ``[F32_TINY, F32_MAX]``.

    Bounded by what float32 rows can use: above float32's max (~3.4e38) the first step
    overflows the row, and below its smallest normal (~1.2e-38) ``1 / value`` does (FTRL
    divides by ``alpha``); either way the rule could not work.
    """
    result = check_float(owner, name, value, gt=0.0)
    if not F32_TINY <= result <= F32_MAX:
        raise ConfigError(
            f"{owner}.{name}: got {value!r}, expected a number in [1.2e-38, 3.4e38] (the "
            "normal float32 range: rows are float32, so a step or its inverse would overflow)"
        )
    return result


def check_nonnegative(owner: str, name: str, value: Any) -> float:
    """An L1/L2 strength, a smoothing term or a starting accumulator: ``[0, F32_MAX]``."""
    result = check_float(owner, name, value, ge=0.0)
    if result > F32_MAX:
        raise ConfigError(
            f"{owner}.{name}: got {value!r}, expected a number in [0, 3.4e38] (float32's "
            "range: rows are float32)"
        )
    return result
