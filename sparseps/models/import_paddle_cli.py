"""``sparseps import-paddle SAVE --out DIR``: a Paddle PS save into a sparseps checkpoint.

SAVE is what ``fleet.save_persistables`` wrote for a wide&deep job of the Paddle peer's
shape with ``CtrCommonAccessor`` tables (:mod:`sparseps.models.paddle_wide_deep`); the
flags say what the save does not record (the program's shape and the accessor's
fields, by Paddle's names). Load the result with the model
``PaddleCtrSpec(...).model()`` and ``trainer.load_checkpoint(DIR)``.
"""

from __future__ import annotations

import argparse
import json
import logging

from ..errors import ConfigError

__all__ = ["add_arguments", "run"]

log = logging.getLogger(__name__)
_CTR_FIELDS = ("embedx_threshold", "nonclk_coeff", "click_coeff", "base_threshold",
               "delta_threshold", "show_click_decay_rate", "delete_threshold")  # fmt: skip
_CTR_INTS = ("delta_keep_days", "delete_after_unseen_days")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("save", help="the Paddle save (fleet.save_persistables' folder)")
    parser.add_argument("--out", required=True, help="the sparseps checkpoint to write")
    parser.add_argument("--slots", default=",".join(f"C{j}" for j in range(1, 27)),
                        help="slot names in the program's order (default C1..C26)")  # fmt: skip
    parser.add_argument("--num-dense", type=int, default=13)
    parser.add_argument("--hidden", default="400,400,400", help="fc widths before fc_out")
    parser.add_argument("--embedx-dim", type=int, required=True,
                        help="deep_emb's embedx_dim (its sparse_embedding size minus 3)")  # fmt: skip
    parser.add_argument("--table-ids", default="0,1,2",
                        help="folders of deep_emb, wide_emb and the dense table")  # fmt: skip
    for name in _CTR_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=None)
    for name in _CTR_INTS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--embed-sgd", default="{}", help="embed_sgd_param fields, JSON")
    parser.add_argument("--embedx-sgd", default="{}", help="embedx_sgd_param fields, JSON")


def run(args: argparse.Namespace) -> int:
    from .paddle_wide_deep import PaddleCtrSpec, import_paddle

    try:
        ids = tuple(int(x) for x in args.table_ids.split(","))
        embed_sgd, embedx_sgd = json.loads(args.embed_sgd), json.loads(args.embedx_sgd)
    except ValueError as exc:
        raise ConfigError(f"import-paddle: {exc}") from exc
    if len(ids) != 3:
        raise ConfigError(f"import-paddle: --table-ids takes 3 ids, got {args.table_ids!r}")
    ctr = {name: getattr(args, name) for name in (*_CTR_FIELDS, *_CTR_INTS)}
    spec = PaddleCtrSpec(
        slots=tuple(s for s in args.slots.split(",") if s), num_dense=args.num_dense,
        hidden=tuple(int(h) for h in args.hidden.split(",") if h), embedx_dim=args.embedx_dim,
        ctr={k: v for k, v in ctr.items() if v is not None}, embed_sgd=embed_sgd,
        embedx_sgd=embedx_sgd, table_ids=(ids[0], ids[1], ids[2]),
    )  # fmt: skip
    manifest = import_paddle(args.save, args.out, spec)
    rows = {name: entry["rows"] for name, entry in manifest["tables"].items()}
    print(f"sparseps import-paddle: {args.save} -> {args.out}: rows {rows}, "
          f"{manifest['dense']['size']} dense values")  # fmt: skip
    return 0
