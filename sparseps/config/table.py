"""``TableConfig``: one sparse table, frozen and validated (DESIGN §2.5).

A :class:`TableConfig` names a sparse table and says how its rows are built and kept:
``dim``, the optimizer rule (``sparseps.optim``), the :class:`~.values.Initializer` that
makes a row's first value from ``(seed, key)``, the :class:`~.values.Lifecycle` policy
(admission, decay, shrink) and the :class:`~.accessor.Accessor` (the parts of a row).
Every object validates itself at construction and raises
:class:`~sparseps.errors.ConfigError` naming the field, the bad value and what is
accepted. ``to_dict`` gives plain str/int/float/bool/None/list/dict values (msgpack and
JSON safe) and ``from_dict`` rejects unknown keys, so::

    cfg == TableConfig.from_dict(cfg.to_dict())

Worked example::

    TableConfig(name="emb", dim=8, rule=optim.Adagrad(lr=0.05),
                initializer=Initializer.uniform(-0.01, 0.01),
                lifecycle=Lifecycle(admission="count", admit_count=3))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.validate import check_int, check_known_fields
from ..errors import ConfigError
from .accessor import Accessor
from .values import Initializer, Lifecycle, set_field

__all__ = ["MAX_DIM", "TableConfig"]

MAX_DIM = 65536
# fullmatch, never match: "$" also matches before a trailing newline ("emb\n")
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_set = set_field


def _default_rule():
    from .. import optim

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
        accessor: the parts of a row (:class:`~sparseps.config.Accessor`: Paddle's CTR
            accessor); the default is one part that exists from the first push. With an
            embed part, ``dim`` = ``accessor.embed_dim`` + the embedx width, ``rule`` and
            ``initializer`` are the embedx part's.
    """

    name: str
    dim: int
    rule: Any = field(default_factory=_default_rule)
    initializer: Initializer = field(default_factory=_default_initializer)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    seed: int = 0
    memory_rows: int | None = None
    memory_bytes: int | None = None
    accessor: Accessor = field(default_factory=Accessor)

    def __post_init__(self) -> None:
        from ..optim import Rule

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
        if not isinstance(self.accessor, Accessor):
            raise ConfigError(
                f"{owner}.accessor: got {self.accessor!r}, expected a sparseps.config.Accessor"
            )
        self.accessor.check_table(owner, self.dim, self.rule)
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

        ``memory_rows`` / ``memory_bytes`` appear only when set and ``accessor`` only
        when it is not the default, so the configs (and the checkpoint files that record
        them) of today's tables are what they were before these existed.
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
        if self.accessor != Accessor():
            d["accessor"] = self.accessor.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> TableConfig:
        """Build and validate a config from ``to_dict`` output; unknown keys are errors."""
        from ..optim import rule_from_dict

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
        if "accessor" in kwargs:
            kwargs["accessor"] = Accessor.from_dict(kwargs["accessor"])
        return cls(**kwargs)

    @property
    def pull_dim(self) -> int:
        """Columns of a pull: ``dim``, plus show and click in front with ``accessor.cvm``."""
        return self.dim + 2 * self.accessor.cvm

    @property
    def full_width(self) -> int:
        """Columns of a whole row (GPUPS' pull_full/write_rows): ``dim`` then the optimizer
        state (a split table's embed state, then its embedx state)."""
        if not self.accessor.split:
            return self.dim + self.rule.state_dim(self.dim)
        embed = self.accessor.embed_rule_or(self.rule).state_dim(self.accessor.embed_dim)
        return self.dim + embed + self.rule.state_dim(self.embedx_dim)

    @property
    def embedx_dim(self) -> int:
        """Width of the embedx part: ``dim - accessor.embed_dim``."""
        return self.dim - self.accessor.embed_dim
