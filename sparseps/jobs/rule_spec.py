"""Rule specs on the command line: ``adam:lr=0.01,eps=1e-8`` -> ``sparseps.optim.Adam``.

The name is a rule's ``name`` (``sgd``, ``adagrad``, ``rowwise_adagrad``, ``adam``,
``ftrl``); the fields are the rule's dataclass fields, validated by the rule itself
(docs/table.md, parameter ranges).
"""

from __future__ import annotations

from ..errors import ConfigError
from ..optim import RULES, rule_from_dict

__all__ = ["parse_rule"]


def parse_rule(spec: str):
    """The rule a spec names, e.g. ``ftrl:alpha=0.05,beta=1`` (fields as floats)."""
    name, _, rest = spec.strip().partition(":")
    if name not in RULES:
        raise ConfigError(f"rule spec {spec!r}: unknown rule {name!r} (known: {sorted(RULES)})")
    fields: dict = {"name": name}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"rule spec {spec!r}: expected field=value, got {item!r}")
        try:
            fields[key.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"rule spec {spec!r}: {key.strip()} is not a number") from None
    return rule_from_dict(fields)
