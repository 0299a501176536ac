"""The ``model`` section of an online config: the model every worker builds (the built-in
wide&deep and its knobs, or ``model.builder``/``model.loss`` references) and its optimizers.

One of the sections :class:`sparseps.online.config.OnlineConfig` is made of.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .config_values import check_choice, check_float, check_int, check_ref, check_str

if TYPE_CHECKING:
    from ..config.values import Lifecycle

__all__ = ["ModelConfig"]

_FLAT_LIFECYCLE = ("decay_rate", "shrink_score", "shrink_unseen_days")  # Lifecycle knobs


@dataclass(frozen=True)
class ModelConfig:
    """The built-in wide&deep model and its optimizers.

    Args:
        emb_dim: deep embedding width.  hidden: MLP widths.
        dense_lr: Adam learning rate of the dense part.
        deep_rule, deep_lr: server rule of the deep table (adam, adagrad, sgd).
        wide_lr: FTRL alpha of the wide table.
        seed: torch seed of the dense initialisation.
        decay_rate: end-of-day show/click decay (in (0, 1]).
        shrink_score, shrink_unseen_days: end-of-day shrink thresholds.
        lifecycle: any other :class:`sparseps.Lifecycle` knob of the tables (feature
            admission: ``{admission: count, admit_count: 3}``, score coefficients...).
            With ``decay_rate``, ``shrink_score`` and ``shrink_unseen_days`` it is read by
            :meth:`sparseps.Lifecycle.from_dict` (:meth:`build_lifecycle`); a knob left
            unset takes the Lifecycle's default.
        init_checkpoint: warm start from this checkpoint when the model dir has none.
        builder: ``module:function`` called as ``function(schema, **params)`` on every
            worker, returning the model (a ``torch.nn.Module`` with SparseEmbedding
            modules); None: the built-in wide&deep, which uses the knobs above.
        params: keyword arguments of ``builder`` (JSON-like values).
        loss: ``module:name`` of a loss: a function ``fn(logits, batch)``, a
            :class:`sparseps.worker.losses.Loss` instance, or a Loss class (built with no
            arguments); None: binary cross-entropy.
    """

    emb_dim: int = 8
    hidden: tuple[int, ...] = (64, 32)
    dense_lr: float = 0.001
    deep_rule: str = "adam"
    deep_lr: float = 0.01
    wide_lr: float = 0.1
    seed: int = 0
    decay_rate: float | None = None  # filled in: the Lifecycle's default
    shrink_score: float | None = None
    shrink_unseen_days: int | None = None
    lifecycle: dict | None = None
    init_checkpoint: str | None = None
    builder: str | None = None
    params: dict | None = None
    loss: str | None = None

    def __post_init__(self) -> None:
        check_int("model.emb_dim", self.emb_dim, 1, 1024)
        if self.builder is not None:
            check_ref("model.builder", self.builder)
        if self.loss is not None:
            check_ref("model.loss", self.loss)
        if self.params is not None:
            if not isinstance(self.params, dict) or not all(
                isinstance(k, str) for k in self.params
            ):
                raise ConfigError(f"model.params: expected a mapping of names, got {self.params!r}")
            if self.builder is None:
                raise ConfigError("model.params: only used with model.builder, which is not set")
        if not isinstance(self.hidden, list | tuple) or not self.hidden:
            raise ConfigError(
                f"model.hidden: expected a non-empty list of widths, got {self.hidden!r}"
            )
        object.__setattr__(
            self, "hidden", tuple(check_int("model.hidden[]", h, 1, 1 << 16) for h in self.hidden)
        )
        check_float("model.dense_lr", self.dense_lr, 0.0, open_lo=True)
        check_choice("model.deep_rule", self.deep_rule, ("adam", "adagrad", "sgd"))
        check_float("model.deep_lr", self.deep_lr, 0.0, open_lo=True)
        check_float("model.wide_lr", self.wide_lr, 0.0, open_lo=True)
        check_int("model.seed", self.seed, 0)
        if self.decay_rate is not None:
            check_float("model.decay_rate", self.decay_rate, 0.0, 1.0, open_lo=True)
        if self.shrink_score is not None:
            check_float("model.shrink_score", self.shrink_score, 0.0)
        if self.shrink_unseen_days is not None:
            check_int("model.shrink_unseen_days", self.shrink_unseen_days, 0)
        if self.lifecycle is not None and not isinstance(self.lifecycle, dict):
            raise ConfigError(f"model.lifecycle: expected a mapping, got {self.lifecycle!r}")
        both = sorted(set(self.lifecycle or {}) & set(_FLAT_LIFECYCLE))
        if both:
            raise ConfigError(f"model.lifecycle: {', '.join(both)} given twice (also as "
                              f"model.{both[0]}); give each once")  # fmt: skip
        built = self.build_lifecycle()
        for key in _FLAT_LIFECYCLE:
            object.__setattr__(self, key, getattr(built, key))

    def build_lifecycle(self) -> Lifecycle:
        """The tables' :class:`sparseps.Lifecycle` (:meth:`~sparseps.Lifecycle.from_dict`)."""
        from ..config.values import Lifecycle

        given = dict(self.lifecycle or {})
        given.update({k: getattr(self, k) for k in _FLAT_LIFECYCLE if getattr(self, k) is not None})
        try:
            return Lifecycle.from_dict(given)
        except ConfigError as exc:  # name the YAML's keys
            raise ConfigError(str(exc).replace("Lifecycle.", "model.lifecycle.")) from None
        if self.init_checkpoint is not None:
            check_str("model.init_checkpoint", self.init_checkpoint)
