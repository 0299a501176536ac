"""Table configuration: frozen, validated dataclasses (DESIGN §2.5).

A :class:`TableConfig` names a sparse table and says how its rows are built and kept:
``dim``, the optimizer rule (``sparseps.optim``), the :class:`Initializer` that makes a
row's first value from ``(seed, key)``, and the :class:`Lifecycle` policy (admission,
decay, shrink). Every object validates itself at construction and raises
:class:`~sparseps.errors.ConfigError` naming the field, the bad value and what is
accepted. ``to_dict`` gives plain str/int/float/bool/None/list/dict values (msgpack and
JSON safe) and ``from_dict`` rejects unknown keys, so::

    cfg == TableConfig.from_dict(cfg.to_dict())

Worked example::

    TableConfig(name="emb", dim=8, rule=optim.Adagrad(lr=0.05),
                initializer=Initializer.uniform(-0.01, 0.01),
                lifecycle=Lifecycle(admission="count", admit_count=3))

The field validators live in :mod:`sparseps.core.validate` (shared with the optimizer
rules); ``check_float`` and ``check_int`` are re-exported here for existing callers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from .core.validate import check_float, check_int, check_known_fields
from .errors import ConfigError

__all__ = [
    "Admission",
    "InitKind",
    "Initializer",
    "Lifecycle",
    "TableConfig",
    "check_float",
    "check_int",
]

MAX_DIM = 65536
# fullmatch, never match: "$" also matches before a trailing newline ("emb\n")
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def _set(obj: object, name: str, value: object) -> None:
    # frozen dataclasses normalise their own fields in __post_init__
    object.__setattr__(obj, name, value)


_E = TypeVar("_E", bound=StrEnum)


def _enum(owner: str, name: str, enum: type[_E], value: Any) -> _E:
    try:
        return enum(value)
    except ValueError:
        accepted = [member.value for member in enum]
        raise ConfigError(f"{owner}.{name}: got {value!r}, expected one of {accepted}") from None


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


# -- table ----------------------------------------------------------------------------------


def _default_rule():
    from . import optim

    return optim.Adagrad()


def _default_initializer() -> Initializer:
    return Initializer.uniform(-0.01, 0.01)


@dataclass(frozen=True)
class TableConfig:
    """One sparse table: name, width, optimizer rule, initializer, lifecycle, seed.

    Args:
        name: 1-128 characters from ``[A-Za-z0-9_.-]`` (it becomes part of file names).
        dim: embedding width, 1..65536.
        rule: a ``sparseps.optim`` rule (SGD, Adagrad, RowwiseAdagrad, Adam, FTRL).
        initializer: first value of a row, a pure function of ``(seed, key)``.
        lifecycle: admission / decay / shrink policy.
        seed: table seed in ``[0, 2**64)``; same seed and key give the same initial row on
            any number of servers.
        memory_rows: None (default: every row in memory) or the number of rows each
            server keeps in memory; the others live in a row file under the server's disk
            dir (``--disk-dir`` / ``SPARSEPS_DISK_DIR``), with identical results
            (docs/table.md, "Tables larger than memory").
        memory_bytes: the same budget in bytes of rows (each server keeps
            ``memory_bytes // row bytes`` rows in memory, at least one); set one of the two.
    """

    name: str
    dim: int
    rule: Any = field(default_factory=_default_rule)
    initializer: Initializer = field(default_factory=_default_initializer)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    seed: int = 0
    memory_rows: int | None = None
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        from .optim import Rule

        owner = "TableConfig"
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ConfigError(
                f"{owner}.name: got {self.name!r}, expected 1-128 characters from [A-Za-z0-9_.-]"
            )
        _set(self, "dim", check_int(owner, "dim", self.dim, ge=1, le=MAX_DIM))
        if not isinstance(self.rule, Rule):
            raise ConfigError(
                f"{owner}.rule: got {self.rule!r}, expected a sparseps.optim rule "
                "(SGD, Adagrad, RowwiseAdagrad, Adam, FTRL)"
            )
        if not isinstance(self.initializer, Initializer):
            raise ConfigError(
                f"{owner}.initializer: got {self.initializer!r}, expected a sparseps.config.Initializer"
            )
        if not isinstance(self.lifecycle, Lifecycle):
            raise ConfigError(
                f"{owner}.lifecycle: got {self.lifecycle!r}, expected a sparseps.config.Lifecycle"
            )
        _set(self, "seed", check_int(owner, "seed", self.seed, ge=0, le=2**64 - 1))
        if self.memory_rows is not None:
            rows = check_int(owner, "memory_rows", self.memory_rows, ge=1, le=2**31 - 1)
            _set(self, "memory_rows", rows)
        if self.memory_bytes is not None:
            budget = check_int(owner, "memory_bytes", self.memory_bytes, ge=1, le=2**62)
            _set(self, "memory_bytes", budget)
            if self.memory_rows is not None:
                raise ConfigError(
                    f"{owner}: memory_rows={self.memory_rows} and memory_bytes={budget} are "
                    "two ways to set one budget; set one of them"
                )

    @property
    def tiered(self) -> bool:
        """Whether the table has a memory budget (rows beyond it live on disk)."""
        return self.memory_rows is not None or self.memory_bytes is not None

    def budget_rows(self, row_bytes: int) -> int | None:
        """Rows a server keeps in memory for rows of ``row_bytes`` bytes; None: all."""
        if self.memory_bytes is not None:
            return max(1, min(2**31 - 1, self.memory_bytes // row_bytes))
        return self.memory_rows

    def to_dict(self) -> dict:
        """Plain values only (str/int/float/bool/None/list/dict), safe for msgpack and JSON.

        ``memory_rows`` / ``memory_bytes`` appear only when set, so the configs (and the
        checkpoint files that record them) of in-memory tables are what they were before
        they existed.
        """
        d = {
            "name": self.name,
            "dim": self.dim,
            "rule": self.rule.to_dict(),
            "initializer": self.initializer.to_dict(),
            "lifecycle": self.lifecycle.to_dict(),
            "seed": self.seed,
        }
        if self.memory_rows is not None:
            d["memory_rows"] = self.memory_rows
        if self.memory_bytes is not None:
            d["memory_bytes"] = self.memory_bytes
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> TableConfig:
        """Build and validate a config from ``to_dict`` output; unknown keys are errors."""
        from .optim import rule_from_dict

        check_known_fields("TableConfig", d, {f.name for f in fields(cls)})
        for required in ("name", "dim"):
            if required not in d:
                raise ConfigError(f"TableConfig: missing key {required!r}")
        kwargs = dict(d)
        if "rule" in kwargs:
            kwargs["rule"] = rule_from_dict(kwargs["rule"])
        if "initializer" in kwargs:
            kwargs["initializer"] = Initializer.from_dict(kwargs["initializer"])
        if "lifecycle" in kwargs:
            kwargs["lifecycle"] = Lifecycle.from_dict(kwargs["lifecycle"])
        return cls(**kwargs)
