"""``sparseps build-index PRED_DIR --out INDEX_DIR``: a faiss index from dumped item vectors."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pred_dir", help="a predict_from_dataset output folder (with MANIFEST.json)"
    )
    parser.add_argument("--out", required=True, help="index folder to write")
    parser.add_argument("--column", default="item_vec", help="the vector column (default item_vec)")
    parser.add_argument("--kind", default="ivf", choices=("flat", "ivf", "hnsw"))
    parser.add_argument("--metric", default="ip", choices=("ip", "l2"))
    parser.add_argument("--nlist", type=int, default=None, help="ivf cells (default ~4*sqrt(n))")
    parser.add_argument("--nprobe", type=int, default=8, help="ivf cells searched per query")
    parser.add_argument("--json", action="store_true", help="print the index metadata as JSON")


def run(args: argparse.Namespace) -> int:
    from .index import INDEX_META, IndexSpec, build_index

    spec = IndexSpec(kind=args.kind, metric=args.metric, nlist=args.nlist, nprobe=args.nprobe)
    out = build_index(args.pred_dir, args.out, column=args.column, spec=spec)
    meta = json.loads((out / INDEX_META).read_text())
    if args.json:
        print(json.dumps(meta, sort_keys=True))
    else:
        print(
            f"index {out}: {meta['items']} items, dim {meta['dim']}, {meta['kind']}/{meta['metric']}"
        )
    return 0
