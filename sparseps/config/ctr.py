"""``ctr_table``: a :class:`~sparseps.config.TableConfig` from Paddle's CTR accessor fields.

Paddle configures a sparse table with a ``TableAccessorParameter`` (``embedx_dim``,
``embedx_threshold``, ``ctr_accessor_param`` with the score and save thresholds, and one
``SparseCommonSGDRuleParameter`` per part). :func:`ctr_table` takes those names one to
one, so a PaddleRec ``config.yaml`` maps onto a sparseps table field by field; the
defaults are what Paddle 2.6's ``the_one_ps.py`` fills in for fields a user leaves out.
docs/table.md lists where each field lands.

Example (PaddleRec ``slot_dnn``-style)::

    ctr_table("emb", embedx_dim=8, embedx_threshold=10, base_threshold=1.5,
              delta_threshold=0.25, show_click_decay_rate=0.98, delete_threshold=0.8,
              embedx_sgd=dict(name="SparseAdaGradSGDRule", learning_rate=0.05))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .accessor import Accessor
from .table import TableConfig
from .values import Initializer, Lifecycle

__all__ = ["ctr_table", "paddle_rule"]

# what the_one_ps.py fills in for a missing SparseCommonSGDRuleParameter field
_SGD_DEFAULTS: dict[str, Any] = {
    "name": "SparseAdaGradSGDRule",
    "learning_rate": 0.05,
    "initial_g2sum": 3.0,
    "initial_range": 1e-4,
    "weight_bounds": (-10.0, 10.0),
}
_RULE_FIELDS = {
    "SparseAdaGradSGDRule": {"learning_rate", "initial_g2sum", "initial_range", "weight_bounds"},
    "SparseNaiveSGDRule": {"learning_rate", "initial_range", "weight_bounds"},
}


def paddle_rule(params: Mapping[str, Any] | None = None):
    """``(rule, initializer)`` of a Paddle ``SparseCommonSGDRuleParameter``.

    ``SparseAdaGradSGDRule`` -> :class:`~sparseps.optim.SparseAdagrad` (one g2sum per
    row), ``SparseNaiveSGDRule`` -> :class:`~sparseps.optim.SGD`; ``weight_bounds`` is the
    rule's ``clip``, ``initial_range`` r the initializer ``uniform(-r, r)``.

    Raises:
        ConfigError: another rule name (Paddle's Adam variants and StdAdaGrad keep state
            sparseps' rules do not: not mapped), or an unknown field.
    """
    from .. import optim

    given = dict(params or {})
    name = given.get("name", _SGD_DEFAULTS["name"])
    if name not in _RULE_FIELDS:
        raise ConfigError(
            f"paddle sgd rule: {name!r} is not mapped; sparseps maps {sorted(_RULE_FIELDS)}"
        )
    unknown = sorted(set(given) - _RULE_FIELDS[name] - {"name"})
    if unknown:
        raise ConfigError(f"paddle sgd rule {name}: unknown field(s) {unknown}")
    p = {**_SGD_DEFAULTS, **given}
    low, high = (float(b) for b in p["weight_bounds"])
    bounds = (low, high)
    rule: optim.Rule
    if name == "SparseAdaGradSGDRule":
        rule = optim.SparseAdagrad(
            lr=p["learning_rate"], initial_g2sum=p["initial_g2sum"], clip=bounds
        )
    else:
        rule = optim.SGD(lr=p["learning_rate"], clip=bounds)
    r = float(p["initial_range"])
    init = Initializer.uniform(-r, r) if r > 0 else Initializer.zeros()
    return rule, init


def ctr_table(
    name: str,
    embedx_dim: int,
    *,
    embedx_threshold: float = 0.0,
    nonclk_coeff: float = 0.1,
    click_coeff: float = 1.0,
    base_threshold: float = 0.0,
    delta_threshold: float = 0.0,
    delta_keep_days: int = 16,
    show_click_decay_rate: float = 1.0,
    delete_threshold: float = 0.0,
    delete_after_unseen_days: int = 30,
    embed_sgd: Mapping[str, Any] | None = None,
    embedx_sgd: Mapping[str, Any] | None = None,
    cvm: bool = True,
    embedx_dtype: str = "float32",
    slot_dims: Any = (),
    seed: int = 0,
    memory_rows: int | None = None,
) -> TableConfig:
    """A table of Paddle's ``CtrCommonAccessor`` (``CtrDymfAccessor`` with
    ``slot_dims``), by Paddle's field names; see the module docstring.

    Returns:
        A :class:`TableConfig` with ``dim = 1 + embedx_dim`` (embed_w, then embedx).
    """
    embed_rule, _ = paddle_rule(embed_sgd)
    rule, initializer = paddle_rule(embedx_sgd)
    lifecycle = Lifecycle(
        nonclick_coeff=nonclk_coeff,
        click_coeff=click_coeff,
        decay_rate=show_click_decay_rate,
        shrink_score=delete_threshold,
        shrink_unseen_days=delete_after_unseen_days,
        base_score=base_threshold,
    )
    accessor = Accessor(
        embed_dim=1,
        embed_rule=embed_rule,
        embedx_threshold=embedx_threshold,
        embedx_dtype=embedx_dtype,  # type: ignore[arg-type]
        cvm=cvm,
        delta_threshold=delta_threshold,
        delta_keep_days=delta_keep_days,
        slot_dims=slot_dims,
    )
    return TableConfig(
        name=name,
        dim=1 + embedx_dim,
        rule=rule,
        initializer=initializer,
        lifecycle=lifecycle,
        seed=seed,
        memory_rows=memory_rows,
        accessor=accessor,
    )
