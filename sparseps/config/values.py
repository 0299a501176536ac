"""The values of a table's config: how a row starts (:class:`Initializer`) and how a
feature lives (:class:`Lifecycle`: admission, decay, shrink), with the small helpers every
config class of this package shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, TypeVar

from ..core.validate import check_float, check_int, check_known_fields
from ..errors import ConfigError

__all__ = ["Admission", "InitKind", "Initializer", "Lifecycle", "enum_field", "set_field"]


def set_field(obj: object, name: str, value: object) -> None:
    """Set a field of a frozen dataclass (it normalises its own fields in __post_init__)."""
    object.__setattr__(obj, name, value)


_E = TypeVar("_E", bound=StrEnum)


def enum_field(owner: str, name: str, enum: type[_E], value: Any) -> _E:
    """``value`` as a member of ``enum``, or ConfigError naming ``owner.name`` and the
    accepted values."""
    try:
        return enum(value)
    except ValueError:
        accepted = [member.value for member in enum]
        raise ConfigError(f"{owner}.{name}: got {value!r}, expected one of {accepted}") from None


_set = set_field
_enum = enum_field


# -- initializer ----------------------------------------------------------------------------


class InitKind(StrEnum):
    ZEROS = "zeros"
    CONSTANT = "constant"
    UNIFORM = "uniform"
    NORMAL = "normal"


# which numeric fields each kind uses; the others must keep their default 0.0
_INIT_FIELDS = {
    InitKind.ZEROS: (),
    InitKind.CONSTANT: ("value",),
    InitKind.UNIFORM: ("low", "high"),
    InitKind.NORMAL: ("mean", "std"),
}


@dataclass(frozen=True)
class Initializer:
    """How a row's first embedding is made from ``(table seed, key)``.

    Build it with a constructor: ``Initializer.zeros()``, ``.constant(v)``,
    ``.uniform(low, high)`` (values in ``[low, high)``), ``.normal(mean, std)``.
    The values are a pure function of ``(seed, key, element)``; see
    ``sparseps.table.initializers``.
    """

    kind: InitKind = InitKind.ZEROS
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    mean: float = 0.0
    std: float = 0.0

    def __post_init__(self) -> None:
        owner = "Initializer"
        kind = _enum(owner, "kind", InitKind, self.kind)
        _set(self, "kind", kind)
        for name in ("value", "low", "high", "mean", "std"):
            _set(self, name, check_float(owner, name, getattr(self, name)))
            if name not in _INIT_FIELDS[kind] and getattr(self, name) != 0.0:
                raise ConfigError(
                    f"{owner}.{name}: not used by kind {kind.value!r} "
                    f"(which takes {list(_INIT_FIELDS[kind]) or 'no parameters'}); leave it 0"
                )
        if kind is InitKind.UNIFORM and not self.low < self.high:
            raise ConfigError(f"{owner}.uniform: low={self.low} must be < high={self.high}")
        if kind is InitKind.NORMAL and self.std < 0:
            raise ConfigError(f"{owner}.normal: std={self.std} must be >= 0")

    @classmethod
    def zeros(cls) -> Initializer:
        return cls(InitKind.ZEROS)

    @classmethod
    def constant(cls, value: float) -> Initializer:
        return cls(InitKind.CONSTANT, value=value)

    @classmethod
    def uniform(cls, low: float, high: float) -> Initializer:
        return cls(InitKind.UNIFORM, low=low, high=high)

    @classmethod
    def normal(cls, mean: float, std: float) -> Initializer:
        return cls(InitKind.NORMAL, mean=mean, std=std)

    def to_dict(self) -> dict:
        """``{"kind": ..., <only the parameters this kind uses>}``."""
        return {
            "kind": self.kind.value,
            **{name: getattr(self, name) for name in _INIT_FIELDS[self.kind]},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Initializer:
        check_known_fields("Initializer", d, {f.name for f in fields(cls)})
        if "kind" not in d:
            raise ConfigError("Initializer: missing key 'kind' (zeros, constant, uniform, normal)")
        return cls(**d)


# -- lifecycle ------------------------------------------------------------------------------


class Admission(StrEnum):
    ALWAYS = "always"
    COUNT = "count"
    PROBABILITY = "probability"
    SCORE = "score"


@dataclass(frozen=True)
class Lifecycle:
    """Feature admission, daily decay and shrink (DESIGN §2.5).

    ``score = (show - click) * nonclick_coeff + click * click_coeff`` (Paddle's
    show_click_score).

    Args:
        admission: ``"always"`` (every pushed key becomes a row), ``"count"`` (once its
            accumulated show count reaches ``admit_count``), ``"probability"`` (each push
            that carries the key admits it with probability ``admit_probability``, decided
            by a hash of (seed, key, attempt) so every shard and replay agrees) or
            ``"score"`` (once its score reaches ``admit_score``).
        admit_count: shows needed by ``"count"`` (>= 1).
        admit_probability: per-push admission probability of ``"probability"`` in (0, 1].
        admit_score: score needed by ``"score"`` (>= 0).
        nonclick_coeff, click_coeff: the score weights (>= 0).
        decay_rate: ``decay()`` multiplies show and click by it, in (0, 1].
        shrink_score: ``shrink()`` deletes rows whose score is below it.
        shrink_unseen_days: ``shrink()`` deletes rows unseen for more days than this.
        base_score: a base inference model keeps rows whose score is >= this.
    """

    admission: Admission = Admission.ALWAYS
    admit_count: int = 1
    admit_probability: float = 1.0
    admit_score: float = 0.0
    nonclick_coeff: float = 0.1
    click_coeff: float = 1.0
    decay_rate: float = 0.98
    shrink_score: float = 0.0
    shrink_unseen_days: int = 30
    base_score: float = 0.0

    def __post_init__(self) -> None:
        owner = "Lifecycle"
        _set(self, "admission", _enum(owner, "admission", Admission, self.admission))
        _set(self, "admit_count", check_int(owner, "admit_count", self.admit_count, ge=1, le=2**24))
        _set(
            self,
            "admit_probability",
            check_float(owner, "admit_probability", self.admit_probability, gt=0.0, le=1.0),
        )
        _set(self, "admit_score", check_float(owner, "admit_score", self.admit_score, ge=0.0))
        _set(
            self,
            "nonclick_coeff",
            check_float(owner, "nonclick_coeff", self.nonclick_coeff, ge=0.0),
        )
        _set(self, "click_coeff", check_float(owner, "click_coeff", self.click_coeff, ge=0.0))
        _set(self, "decay_rate", check_float(owner, "decay_rate", self.decay_rate, gt=0.0, le=1.0))
        _set(self, "shrink_score", check_float(owner, "shrink_score", self.shrink_score))
        _set(
            self,
            "shrink_unseen_days",
            check_int(owner, "shrink_unseen_days", self.shrink_unseen_days, ge=0, le=2**24),
        )
        _set(self, "base_score", check_float(owner, "base_score", self.base_score))

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["admission"] = self.admission.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Lifecycle:
        check_known_fields("Lifecycle", d, {f.name for f in fields(cls)})
        return cls(**d)
