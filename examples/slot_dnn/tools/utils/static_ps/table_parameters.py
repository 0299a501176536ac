"""A PaddleRec config's ``table_parameters`` as sparseps tables, one setting to one field.

PaddleRec hands ``table_parameters.<param name>`` to Paddle's ``the_one_ps.py``, which
fills a ``TableParameter`` (``table_class``, ``shard_num``, a ``TableAccessorParameter``
with its ``ctr_accessor_param`` and one ``SparseCommonSGDRuleParameter`` per part) for the
sparse table of that parameter name. Here the same block becomes the
:class:`sparseps.config.TableConfig` of the table of that name through
:func:`sparseps.config.ctr_table`, which takes Paddle's field names. Every field is
either mapped or named in :data:`NOT_MAPPED` with the reason; anything else is refused,
so a setting is never dropped in silence. docs/migrating-from-paddle.md ("PaddleRec's
slot_dnn") has the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparseps.config import TableConfig, ctr_table

__all__ = ["NOT_MAPPED", "table_config"]

# the accessors whose rows are sparseps' split rows (embed_w + an embedx part)
ACCESSORS = ("SparseAccessor", "CtrCommonAccessor", "CtrDymfAccessor")
# a rule's parameters sit under a key of their own in the yaml (the_one_ps.py reads it)
RULE_BLOCKS = {"SparseAdaGradSGDRule": "adagrad", "SparseNaiveSGDRule": "naive"}
# fields with no sparseps counterpart, and why
NOT_MAPPED = {
    "shard_num": "sparseps shards a table by key over its servers; no shard count to set",
    "ssd_unseenday_threshold": "the disk tier is a cache (memory_rows), not a policy by days",
}
CTR_FIELDS = {
    "nonclk_coeff", "click_coeff", "base_threshold", "delta_threshold", "delta_keep_days",
    "show_click_decay_rate", "delete_threshold", "delete_after_unseen_days",
}  # fmt: skip


def _refuse(where: str, what: str) -> None:
    raise ValueError(f"table_parameters.{where}: {what}")


def _whole(where: str, value: Any) -> int:
    """Paddle writes day counts as floats (``16.0``); sparseps counts whole days."""
    if float(value) != int(float(value)):
        _refuse(where, f"{value!r} is not a whole number of days")
    return int(float(value))


def _rule(where: str, block: Mapping[str, Any]) -> dict[str, Any]:
    """``{name, adagrad: {...}}`` -> ``{name, learning_rate, ...}`` (ctr_table's form)."""
    name = block.get("name", "SparseAdaGradSGDRule")
    if name not in RULE_BLOCKS:
        _refuse(where, f"rule {name!r} is not mapped (mapped: {sorted(RULE_BLOCKS)})")
    params = dict(block.get(RULE_BLOCKS[name]) or {})
    unknown = set(block) - {"name", RULE_BLOCKS[name]}
    if unknown:
        _refuse(where, f"unknown field(s) {sorted(unknown)}")
    return {"name": name, **params}


def table_config(name: str, table: Mapping[str, Any], *, emb_dim: int, cvm: bool) -> TableConfig:
    """The sparseps table of ``table_parameters.<name>``.

    Args:
        name: the parameter (and table) name, e.g. ``"embedding"``.
        table: the yaml block under ``table_parameters.<name>``.
        emb_dim: the model's ``sparse_embedding`` size (PaddleRec's
            ``hyper_parameters.emb_dim``): it must be ``1 + embedx_dim``.
        cvm: whether the model takes the slots' show/click features (the pull then
            carries them, and ``fea_dim`` counts them).

    Raises:
        ValueError: a field that does not fit (named, with the value), or one that is
            neither mapped nor in :data:`NOT_MAPPED`.
    """
    unknown = set(table) - {"table_class", "accessor", *NOT_MAPPED}
    if unknown:
        _refuse(name, f"unknown field(s) {sorted(unknown)}")
    if table.get("table_class", "MemorySparseTable") != "MemorySparseTable":
        _refuse(f"{name}.table_class", f"{table['table_class']!r}: this port maps "
                "MemorySparseTable (an SSD table is TableConfig(memory_rows=...))")  # fmt: skip
    accessor = dict(table["accessor"])
    where = f"{name}.accessor"
    if accessor.get("accessor_class") not in ACCESSORS:
        _refuse(f"{where}.accessor_class", f"{accessor.get('accessor_class')!r}: mapped are "
                f"{list(ACCESSORS)}")  # fmt: skip
    known = {"accessor_class", "fea_dim", "embedx_dim", "embedx_threshold", "embed_sgd_param",
             "embedx_sgd_param", "ctr_accessor_param"}  # fmt: skip
    if set(accessor) - known:
        _refuse(where, f"unknown field(s) {sorted(set(accessor) - known)}")
    ctr = dict(accessor.get("ctr_accessor_param") or {})
    if set(ctr) - CTR_FIELDS - set(NOT_MAPPED):
        _refuse(f"{where}.ctr_accessor_param", f"unknown field(s) {sorted(set(ctr) - CTR_FIELDS)}")
    given = {k: ctr[k] for k in CTR_FIELDS if k in ctr}
    for days in ("delta_keep_days", "delete_after_unseen_days"):
        if days in given:
            given[days] = _whole(f"{where}.ctr_accessor_param.{days}", given[days])
    config = ctr_table(
        name,
        int(accessor["embedx_dim"]),
        embedx_threshold=float(accessor.get("embedx_threshold", 0)),
        embed_sgd=_rule(f"{where}.embed_sgd_param", accessor.get("embed_sgd_param") or {}),
        embedx_sgd=_rule(f"{where}.embedx_sgd_param", accessor.get("embedx_sgd_param") or {}),
        cvm=cvm,
        **given,
    )
    if config.dim != emb_dim:
        _refuse(f"{where}.embedx_dim", f"{accessor['embedx_dim']} + embed_w makes rows of "
                f"{config.dim}, the model's emb_dim is {emb_dim}")  # fmt: skip
    if "fea_dim" in accessor and int(accessor["fea_dim"]) != config.pull_dim:
        _refuse(f"{where}.fea_dim", f"{accessor['fea_dim']}, but a pull is {config.pull_dim} "
                f"wide (show, click: {2 * cvm}; embed_w: 1; embedx: {config.dim - 1})")  # fmt: skip
    return config
