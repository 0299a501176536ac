"""Paddle's wide&deep on CTR-accessor tables, and bringing a trained one over.

:class:`PaddleCtrSpec` says what a Paddle PS job of the peer's wide&deep shape
(/work/shared/peers/paddle/train.py: one "deep_emb" table read by every slot, one
"wide_emb" table, fc layers fc0.. fc_out and wide_dense; logit = deep + sum of the wide
weights + wide_dense(dense)) trained, with both tables on Paddle's ``CtrCommonAccessor``
(deep_emb's pull ``[show, click, embed_w, embedx_w...]`` through the cvm op, wide_emb's
``embedx_dim`` 0). :class:`PaddleWideDeep` is that model in sparseps: the deep table a
split table (:func:`~sparseps.config.ctr_table`, ``cvm=True``), the wide table a one-part
table of the embed rule, the dense part :class:`~sparseps.models.WideDeepHead`.

:func:`import_paddle` reads a Paddle save (:mod:`sparseps.files.paddle_save`) and writes
a sparseps checkpoint of that model, field by field:

==========================  ===================================================
Paddle (CtrCommonAccessor)  sparseps checkpoint (split deep table)
==========================  ===================================================
key                         key
slot                        (not kept: sparseps tables know no slot)
unseen_days                 unseen_days
delta_score                 delta_score
show, click                 show, click
embed_w                     embedding[:, 0]
embed_g2sum                 state[:, 0] (the embed rule's g2sum)
embedx_g2sum                state[:, 1] (the embedx rule's g2sum)
embedx_w (when written)     embedding[:, 1:], has_embedx = 1 (else 0: no part)
fcK.w_0 [in, out], b_0      head.deep[2K].weight (transposed), bias
fc_out.w_0, b_0             head.deep[-1]
wide_dense.w_0, b_0         head.wide_dense
==========================  ===================================================

The dense optimizer's state restarts (sparseps' dense rule keeps other state); the
sparse rows keep theirs. Load the checkpoint into ``spec.model()`` with
``trainer.load_checkpoint``; training goes on from Paddle's values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import optim
from ..checkpoint import checkpoint as ck
from ..checkpoint import staging
from ..config import Initializer, TableConfig, ctr_table
from ..config.ctr import paddle_rule
from ..errors import CheckpointError
from ..files import manifest as mf
from ..files import shards
from ..files.dense_file import save_dense_file
from ..files.paddle_save import CtrRows, read_ctr_table, read_dense_table
from ..table import DenseTable, SparseTable
from ..worker.dense_params import DenseParams
from ..worker.nn import SparseEmbedding, SparseModel
from .wide_deep import WideDeepHead

__all__ = ["PaddleCtrSpec", "PaddleWideDeep", "import_paddle"]


@dataclass(frozen=True)
class PaddleCtrSpec:
    """A Paddle wide&deep job on CTR-accessor tables (Paddle's field names).

    Args:
        slots: the slot names, in the order Paddle's program concatenates them.
        num_dense: dense features.
        hidden: the fc widths before fc_out.
        embedx_dim: deep_emb's ``embedx_dim`` (its sparse_embedding size minus 3).
        ctr: ``ctr_accessor_param`` fields and ``embedx_threshold`` (what
            :func:`~sparseps.config.ctr_table` takes), the defaults Paddle 2.6 fills in.
        embed_sgd, embedx_sgd: the parts' ``SparseCommonSGDRuleParameter`` fields.
        table_ids: the save's folder of deep_emb, wide_emb and the dense table.
    """

    slots: tuple[str, ...]
    num_dense: int
    hidden: tuple[int, ...]
    embedx_dim: int
    ctr: Mapping[str, Any] = field(default_factory=dict)
    embed_sgd: Mapping[str, Any] = field(default_factory=dict)
    embedx_sgd: Mapping[str, Any] = field(default_factory=dict)
    table_ids: tuple[int, int, int] = (0, 1, 2)
    deep_table: str = "deep_emb"
    wide_table: str = "wide_emb"

    def tables(self) -> tuple[TableConfig, TableConfig]:
        """``(deep_emb, wide_emb)`` configs."""
        deep = ctr_table(self.deep_table, self.embedx_dim, embed_sgd=self.embed_sgd,
                         embedx_sgd=self.embedx_sgd, cvm=True, **dict(self.ctr))  # fmt: skip
        wide_rule, _ = paddle_rule(self.embed_sgd)
        wide = TableConfig(name=self.wide_table, dim=1, rule=wide_rule,
                           initializer=Initializer.zeros(), lifecycle=deep.lifecycle)  # fmt: skip
        return deep, wide

    def dense_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Paddle's dense parameters, name and shape, in the order of the save."""
        widths = [len(self.slots) * (3 + self.embedx_dim) + self.num_dense, *self.hidden]
        shapes: dict[str, tuple[int, ...]] = {}
        for k, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            shapes[f"fc{k}.w_0"], shapes[f"fc{k}.b_0"] = (a, b), (b,)
        shapes["fc_out.w_0"], shapes["fc_out.b_0"] = (widths[-1], 1), (1,)
        shapes["wide_dense.w_0"], shapes["wide_dense.b_0"] = (self.num_dense, 1), (1,)
        return sorted(shapes.items())

    def model(self) -> PaddleWideDeep:
        return PaddleWideDeep(self)


class PaddleWideDeep(SparseModel):
    """The model of a :class:`PaddleCtrSpec` (see the module docstring)."""

    def __init__(self, spec: PaddleCtrSpec) -> None:
        super().__init__()
        deep, wide = spec.tables()
        self.embeddings = nn.ModuleList([_embedding_of(deep, spec.slots, cvm=True),
                                         _embedding_of(wide, spec.slots, cvm=False)])  # fmt: skip
        # no normalisation of the cvm features: Paddle's program has none
        self.head = WideDeepHead(len(spec.slots), spec.num_dense, deep.pull_dim, spec.hidden)


def _embedding_of(config: TableConfig, slots: Sequence[str], *, cvm: bool) -> SparseEmbedding:
    return SparseEmbedding(config.name, config.dim, slots=tuple(slots), rule=config.rule,
                           initializer=config.initializer, lifecycle=config.lifecycle,
                           seed=config.seed, cvm=cvm, accessor=config.accessor)  # fmt: skip


def _columns(rows: CtrRows, split: bool) -> dict[str, np.ndarray]:
    n = rows.key.size
    common = {
        "key": rows.key, "show": rows.show, "click": rows.click,
        "delta_score": rows.delta_score,
        "unseen_days": np.rint(rows.unseen_days).astype(np.int32),
        "touched": np.zeros(n, np.uint8),
    }  # fmt: skip
    if not split:  # embedx_dim 0: the embed part is the whole row
        return {**common, "embedding": rows.embed_w[:, None].copy(),
                "state": np.ascontiguousarray(rows.embed_state)}  # fmt: skip
    return {
        **common,
        "embedding": np.ascontiguousarray(np.concatenate([rows.embed_w[:, None], rows.embedx], 1)),
        "state": np.ascontiguousarray(np.concatenate([rows.embed_state, rows.embedx_state], 1)),
        "has_embedx": rows.has_embedx.astype(np.uint8),
    }


def _dense_values(spec: PaddleCtrSpec, model: PaddleWideDeep, saved: np.ndarray) -> np.ndarray:
    """Paddle's dense values set into the model's head; returns its flat dense vector."""
    shapes = spec.dense_shapes()
    size = sum(int(np.prod(s)) for _, s in shapes)
    if saved.shape[0] != size:
        raise CheckpointError(
            f"Paddle save: the dense table holds {saved.shape[0]} values, the spec's "
            f"parameters {[n for n, _ in shapes]} take {size}; check hidden/num_dense/slots"
        )
    values, at = {}, 0
    for name, shape in shapes:
        count = int(np.prod(shape))
        values[name] = saved[at : at + count, 0].reshape(shape)
        at += count
    head = model.head
    assert isinstance(head, WideDeepHead)
    layers = [m for m in head.deep if isinstance(m, nn.Linear)]
    names = [f"fc{k}" for k in range(len(spec.hidden))] + ["fc_out"]
    with torch.no_grad():
        for layer, name in zip([*layers, head.wide_dense], [*names, "wide_dense"],
                               strict=True):  # fmt: skip
            layer.weight.copy_(torch.from_numpy(values[f"{name}.w_0"].T.copy()))
            layer.bias.copy_(torch.from_numpy(values[f"{name}.b_0"].copy()))
    return DenseParams(model).values()


def import_paddle(save: str | Path, out: str | Path, spec: PaddleCtrSpec, *,
                  dense_rule: optim.Rule | None = None) -> dict:  # fmt: skip
    """Write a sparseps checkpoint at ``out`` from the Paddle save at ``save``.

    Args:
        dense_rule: the dense optimizer the trainer will use (its state starts fresh);
            default ``optim.Adam()``.

    Returns:
        The checkpoint's manifest.

    Raises:
        CheckpointError: a table folder or value that does not fit the spec.
    """
    save, target = Path(save), Path(out).resolve()
    deep_id, wide_id, dense_id = spec.table_ids
    deep_config, wide_config = spec.tables()
    parts = {
        deep_config.name: (deep_config, _columns(read_ctr_table(
            save, deep_id, embedx_dim=spec.embedx_dim), split=True)),
        wide_config.name: (wide_config, _columns(read_ctr_table(save, wide_id, embedx_dim=0),
                                                 split=False)),
    }  # fmt: skip
    model = spec.model()
    values = _dense_values(spec, model, read_dense_table(save, dense_id))
    dense_rule = dense_rule or optim.Adam()
    dense = DenseTable("dense", values.size, rule=dense_rule)
    dense.set(values)
    staging.recover(target)
    ck.check_replaceable(target)
    staging.remove_stale(target)
    folder = staging.new_staging(target)
    files, tables = {}, {}
    for name, (config, columns) in parts.items():
        table = SparseTable(config)  # validates every field, as a server's load does
        table.import_rows(columns, strict=True)
        records = []
        for kind, data in (("rows", table.export_rows()), ("pending", table.export_pending())):
            meta = {"table": name, "config": config.to_dict(), "rank": 0, "num_servers": 1,
                    "kind": kind, "source": f"paddle save {save}"}  # fmt: skip
            record = shards.write_shard(folder, shards.file_name(name, kind, 0, 1), data, meta)
            records.append({**record, "kind": kind, "rows": int(data["key"].size)})
            files[record["name"]] = mf.entry_of(record)
        tables[name] = {"config": config.to_dict(), "layout": ck.layout_of(config),
                        "rows": len(table), "pending": 0,
                        "files": sorted(r["name"] for r in records), "servers": 1}  # fmt: skip
    dense_name = save_dense_file(folder, dense.export())
    files[dense_name] = mf.file_record(folder / dense_name)
    manifest = mf.write_manifest(
        folder, "sparseps-checkpoint", files, tables=tables,
        dense={"size": int(values.size), "rule": dense_rule.to_dict(), "file": dense_name},
        state={"passes": 0, "mode": "async", "imported_from": str(save)},
    )  # fmt: skip
    staging.commit(folder, target)
    return manifest


def spec_with(spec: PaddleCtrSpec, **changes: Any) -> PaddleCtrSpec:
    """``spec`` with fields replaced (a frozen dataclass)."""
    return dataclasses.replace(spec, **changes)
