"""``RowLayout``: the columns of one stored row, as data.

A sparse table keeps all its rows in one C-contiguous float32 matrix. One row is::

    [ embedding (dim) | optimizer state (state_dim) | show | click | delta_score | unseen ]

e.g. dim 4 with Adagrad (state = one accumulator per element)::

    column   0..3        4..7          8     9      10           11
             embedding   accumulator   show  click  delta_score  unseen

Rules rely only on "embedding first, state right after" (see ``sparseps.optim.base``);
everything else (storage, export, checkpoints) reads offsets from here. ``unseen`` holds
the unseen-days counter as a float (exact to 2**24 days), with -1 meaning "pushed since
the last decay" (exported as ``unseen_days = 0``, ``touched = 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import TableConfig
    from ..optim.base import Rule

__all__ = ["RowLayout", "STAT_COLUMNS"]

STAT_COLUMNS = ("show", "click", "delta_score", "unseen")
KEY_BYTES = 8


@dataclass(frozen=True)
class RowLayout:
    """Column names and offsets of a stored row.

    Attributes:
        dim: embedding width.
        state_dim: optimizer state floats per row.
        state_columns: ``((name, width), ...)`` of the rule's state, in order.
    """

    dim: int
    state_dim: int
    state_columns: tuple[tuple[str, int], ...] = ()

    @classmethod
    def for_rule(cls, dim: int, rule: Rule) -> RowLayout:
        columns = tuple(rule.state_columns(dim))
        return cls(dim=dim, state_dim=sum(w for _, w in columns), state_columns=columns)

    @classmethod
    def for_config(cls, config: TableConfig) -> RowLayout:
        """The columns a table of ``config`` exchanges (exports, checkpoints, whole rows):
        ``for_rule(dim, rule)``, or for a split table (:class:`~sparseps.config.Accessor`)
        the ``dim`` pulled columns and the embed rule's state then the embedx rule's,
        named ``embed.*`` and ``embedx.*``."""
        accessor = config.accessor
        if not accessor.split:
            return cls.for_rule(config.dim, config.rule)
        embed_rule = accessor.embed_rule_or(config.rule)
        columns = tuple(
            (f"embed.{name}", w) for name, w in embed_rule.state_columns(accessor.embed_dim)
        ) + tuple((f"embedx.{name}", w) for name, w in config.rule.state_columns(config.embedx_dim))
        return cls(config.dim, sum(w for _, w in columns), columns)

    @property
    def width(self) -> int:
        """float32 values per stored row."""
        return self.dim + self.state_dim + len(STAT_COLUMNS)

    @property
    def offsets(self) -> dict[str, tuple[int, int]]:
        """``name -> (first column, width)`` for embedding, state parts and statistics."""
        result = {"embedding": (0, self.dim), "state": (self.dim, self.state_dim)}
        at = self.dim
        for name, width in self.state_columns:
            result[f"state.{name}"] = (at, width)
            at += width
        for i, name in enumerate(STAT_COLUMNS):
            result[name] = (self.dim + self.state_dim + i, 1)
        return result

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.offsets)

    def column(self, name: str) -> int:
        """The first column of ``name`` (``"show"``, ``"embedding"``, ``"state.m"`` ...)."""
        return self.offsets[name][0]

    @property
    def payload_bytes(self) -> int:
        """Bytes a row really needs: 8-byte key + embedding + state + 4 statistics."""
        return KEY_BYTES + 4 * self.width

    def to_dict(self) -> dict:
        return {
            "dim": self.dim,
            "state_dim": self.state_dim,
            "state_columns": [[name, width] for name, width in self.state_columns],
            "stat_columns": list(STAT_COLUMNS),
        }
