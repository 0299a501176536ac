"""``Accessor``: how a table's row is split into Paddle's CTR accessor parts.

Paddle's ``CtrCommonAccessor`` (``paddle/fluid/distributed/ps/table/ctr_accessor.h``)
keeps, per feature, an **embed** part (one weight ``embed_w`` and its optimizer state,
e.g. one ``g2sum``) and an **embedx** part (the ``embedx_dim``-wide vector and its
state), each updated by its own rule (``embed_sgd_param``, ``embedx_sgd_param``: their
own learning rates and bounds), plus the show/click statistics. A feature's embedx part
matters only once the feature has been seen enough: ``embedx_threshold`` on the
show/click score. Most ids of a click log are seen a handful of times, so sparseps
*stores* the embedx part only once the score passes the threshold (Paddle's
``NeedExtendMF``): until then a row is its embed part and its counters.

A :class:`~sparseps.config.TableConfig`'s ``dim`` is the width a pull returns: the
embed part's ``embed_dim`` columns, then the embedx part's ``dim - embed_dim``
(Paddle's ``SparseAccessor`` pull value ``[embed_w, embedx_w...]``; with ``cvm`` the
pull also carries each key's show and click, as ``CtrCommonAccessor``'s does). The
table's ``rule`` is the embedx rule and its ``initializer`` the embedx initializer.

``Accessor()`` (the default) is today's tables: no embed part, and the embedx part (the
whole row) exists from the first push. Where the other fields of Paddle's accessor live
(score coefficients, decay, delete and base thresholds: :class:`~sparseps.config.Lifecycle`)
is mapped field by field in docs/table.md; :func:`ctr_table` builds a config from
Paddle's names.

Worked example (Paddle's ``CtrCommonAccessor`` with ``embedx_dim=8``)::

    TableConfig(name="emb", dim=9, rule=optim.SparseAdagrad(),
                initializer=Initializer.uniform(-1e-4, 1e-4),
                accessor=Accessor(embed_dim=1, embedx_threshold=10.0, cvm=True))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..core.validate import check_float, check_int, check_known_fields
from ..errors import ConfigError
from .values import Initializer, enum_field, set_field

if TYPE_CHECKING:
    from ..optim.base import Rule

__all__ = ["Accessor", "EmbedxDtype"]

#: ``delta_keep_days`` default: any number of unseen days (today's delta saves)
ANY_DAYS = 2**24


class EmbedxDtype(StrEnum):
    """How embedx weights are stored (optimizer state is always float32)."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"


def _initializer_zeros() -> Initializer:
    return Initializer.zeros()


@dataclass(frozen=True)
class Accessor:
    """The parts of a row (Paddle's CTR accessor); see the module docstring.

    Args:
        embed_dim: width of the embed part: 0 (today's tables: the whole row is one
            part) or 1 (Paddle's ``embed_w``). The embed part exists for every row.
        embed_rule: the embed part's optimizer rule (``embed_sgd_param``); None: the
            table's rule. Only with ``embed_dim=1``.
        embed_initializer: the embed part's first value (Paddle zero-initialises
            ``embed_w``); default zeros.
        embedx_threshold: the show/click score (:class:`~sparseps.config.Lifecycle`'s
            coefficients) at which a row's embedx part is created; 0: at its first push
            (today's tables). Needs ``embed_dim=1`` when > 0: a row without an embedx
            must still have a weight.
        embedx_dtype: ``"float32"`` or ``"float16"`` storage of the embedx weights (the
            optimizer state stays float32; float16 rounds each stored weight to the
            nearest half, so steps smaller than half its spacing are lost). float16
            needs ``embed_dim=1`` and a rule with a float16 kernel (``SparseAdagrad``).
        cvm: the pull also returns each key's show and click, in front of its embedding
            (Paddle's ``CtrCommonAccessor`` pull value), so a model can take them as
            inputs (``SparseEmbedding(..., cvm=True)``).
        delta_threshold: a delta inference save keeps a row only if its delta score
            (score gained since the last delta save) is >= this (and > 0).
        delta_keep_days: ... and if it was seen within this many days (unseen_days <=).
        slot_dims: ``((slot, embedx dim), ...)``: Paddle's ``CtrDymfAccessor`` per-slot
            embedx widths; a slot listed here reads and trains only the first ``dim``
            columns of the embedx part (each at most the table's embedx width).
    """

    embed_dim: int = 0
    embed_rule: Any = None
    embed_initializer: Initializer = field(default_factory=_initializer_zeros)
    embedx_threshold: float = 0.0
    embedx_dtype: EmbedxDtype = EmbedxDtype.FLOAT32
    cvm: bool = False
    delta_threshold: float = 0.0
    delta_keep_days: int = ANY_DAYS
    slot_dims: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        from ..optim import Rule

        owner = "Accessor"
        set_field(self, "embed_dim", check_int(owner, "embed_dim", self.embed_dim, ge=0, le=1))
        if self.embed_rule is not None:
            if not isinstance(self.embed_rule, Rule):
                raise ConfigError(
                    f"{owner}.embed_rule: got {self.embed_rule!r}, expected None or a "
                    "sparseps.optim rule"
                )
            if self.embed_dim == 0:
                raise ConfigError(f"{owner}.embed_rule: set, but embed_dim is 0 (no embed part)")
        if not isinstance(self.embed_initializer, Initializer):
            raise ConfigError(
                f"{owner}.embed_initializer: got {self.embed_initializer!r}, expected a "
                "sparseps.config.Initializer"
            )
        threshold = check_float(owner, "embedx_threshold", self.embedx_threshold, ge=0.0)
        set_field(self, "embedx_threshold", threshold)
        dtype = enum_field(owner, "embedx_dtype", EmbedxDtype, self.embedx_dtype)
        set_field(self, "embedx_dtype", dtype)
        if not isinstance(self.cvm, bool):
            raise ConfigError(f"{owner}.cvm: got {self.cvm!r}, expected True or False")
        set_field(self, "delta_threshold",
                  check_float(owner, "delta_threshold", self.delta_threshold, ge=0.0))  # fmt: skip
        set_field(self, "delta_keep_days",
                  check_int(owner, "delta_keep_days", self.delta_keep_days, ge=0, le=ANY_DAYS))  # fmt: skip
        set_field(self, "slot_dims", _slot_dims(self.slot_dims))
        needs_embed = [
            reason
            for reason, on in (
                (f"embedx_threshold={threshold}", threshold > 0),
                ("embedx_dtype='float16'", dtype is EmbedxDtype.FLOAT16),
            )
            if on
        ]
        if needs_embed and self.embed_dim == 0:
            raise ConfigError(
                f"{owner}: {' and '.join(needs_embed)} needs embed_dim=1 (a row whose embedx "
                "part is not stored still needs its embed weight); set embed_dim=1"
            )

    @property
    def split(self) -> bool:
        """Whether rows are stored as two parts (an embed part for every row, an embedx
        part for rows that earned one) rather than as one full row."""
        return self.embed_dim > 0

    def embed_rule_or(self, rule: Rule) -> Rule:
        """The embed part's rule: ``embed_rule``, or the table's ``rule``."""
        return rule if self.embed_rule is None else self.embed_rule

    def check_table(self, owner: str, dim: int, rule: Rule) -> None:
        """What the accessor needs from its table's ``dim`` and ``rule``.

        Raises:
            ConfigError: no embedx column is left, a slot dim is wider than the embedx
                part, or float16 with a rule that has no float16 kernel.
        """
        embedx = dim - self.embed_dim
        if embedx < 1:
            raise ConfigError(
                f"{owner}.dim: {dim} leaves no embedx column after the embed part "
                f"(embed_dim={self.embed_dim}); dim is embed_dim + the embedx width"
            )
        wide = [(slot, d) for slot, d in self.slot_dims if d > embedx]
        if wide:
            raise ConfigError(
                f"{owner}.accessor.slot_dims: {wide} wider than the embedx part ({embedx} = "
                f"dim {dim} - embed_dim {self.embed_dim})"
            )
        if self.embedx_dtype is EmbedxDtype.FLOAT16 and not hasattr(rule, "update_half"):
            raise ConfigError(
                f"{owner}.accessor.embedx_dtype: float16 needs a rule with a float16 kernel "
                f"(SparseAdagrad); the table's rule is {rule.name!r}"
            )

    def to_dict(self) -> dict:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["embed_rule"] = None if self.embed_rule is None else self.embed_rule.to_dict()
        d["embed_initializer"] = self.embed_initializer.to_dict()
        d["embedx_dtype"] = self.embedx_dtype.value
        d["slot_dims"] = [[slot, dim] for slot, dim in self.slot_dims]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Accessor:
        from ..optim import rule_from_dict

        check_known_fields("Accessor", d, {f.name for f in fields(cls)})
        kwargs = dict(d)
        if kwargs.get("embed_rule") is not None:
            kwargs["embed_rule"] = rule_from_dict(kwargs["embed_rule"])
        if "embed_initializer" in kwargs:
            kwargs["embed_initializer"] = Initializer.from_dict(kwargs["embed_initializer"])
        return cls(**kwargs)


def _slot_dims(value: Any) -> tuple[tuple[str, int], ...]:
    if isinstance(value, Mapping):
        value = list(value.items())
    if not isinstance(value, list | tuple):
        raise ConfigError(
            f"Accessor.slot_dims: got {value!r}, expected ((slot name, embedx dim), ...)"
        )
    out = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise ConfigError(
                f"Accessor.slot_dims: got item {item!r}, expected (slot name, embedx dim)"
            )
        out.append((item[0], check_int("Accessor", f"slot_dims[{item[0]!r}]", item[1], ge=1)))
    names = [slot for slot, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"Accessor.slot_dims: a slot is listed twice in {names}")
    return tuple(out)
