"""Build a faiss index from a prediction folder's item vectors; query it for the top k.

An index folder holds ``index.faiss`` (the faiss index; row ``i`` is item ``i``),
``keys.npy`` (uint64 item keys, row order) and ``INDEX.json`` (written last:
``{"kind", "metric", "dim", "items", "nlist", "nprobe", "source", "vector_column"}``).

Kinds: ``flat`` (exact), ``ivf`` (``IndexIVFFlat``: ``nlist`` k-means cells, ``nprobe``
searched per query), ``hnsw`` (``IndexHNSWFlat``, 32 links). Metric ``ip`` (inner
product: the two-tower score, vectors are L2-normalised) or ``l2``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..core.atomic_file import replaced_atomically
from ..core.keysets import unique_keys
from ..errors import CheckpointError, ConfigError, InputError

__all__ = ["IndexSpec", "RecallIndex", "brute_force_top_k", "build_index", "recall_at_k"]

log = logging.getLogger(__name__)

KINDS = ("flat", "ivf", "hnsw")
METRICS = ("ip", "l2")
INDEX_META = "INDEX.json"


def _faiss():
    try:
        import faiss
    except ImportError:
        raise ConfigError(
            "recall needs faiss, which is not installed: pip install sparseps[recall] "
            "(or pip install faiss-cpu)"
        ) from None
    return faiss


@dataclass(frozen=True)
class IndexSpec:
    """What index to build.

    Args:
        kind: ``flat``, ``ivf`` or ``hnsw``.
        metric: ``ip`` or ``l2``.
        nlist: ivf cells (default: about ``4 * sqrt(items)``, at most items / 8).
        nprobe: ivf cells searched per query.
    """

    kind: str = "ivf"
    metric: str = "ip"
    nlist: int | None = None
    nprobe: int = 8

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"IndexSpec.kind: expected one of {KINDS}, got {self.kind!r}")
        if self.metric not in METRICS:
            raise ConfigError(f"IndexSpec.metric: expected one of {METRICS}, got {self.metric!r}")
        if self.nlist is not None and (not isinstance(self.nlist, int) or self.nlist < 1):
            raise ConfigError(f"IndexSpec.nlist: an int >= 1, got {self.nlist!r}")
        if not isinstance(self.nprobe, int) or self.nprobe < 1:
            raise ConfigError(f"IndexSpec.nprobe: an int >= 1, got {self.nprobe!r}")


def _item_vectors(pred_dir, column: str) -> tuple[np.ndarray, np.ndarray]:
    from ..worker.predict import read_manifest, read_predictions

    manifest = read_manifest(pred_dir)
    if column not in manifest["outputs"]:
        raise InputError(
            f"{pred_dir}: no output column {column!r} (the dump has {manifest['outputs']}); "
            "dump it with predict_from_dataset(..., outputs=(...))"
        )
    table = read_predictions(pred_dir, columns=["key", column])
    keys = table.column("key").to_numpy().astype(np.uint64, copy=False)
    flat = table.column(column).combine_chunks()
    dim = flat.type.list_size
    vectors = flat.values.to_numpy().astype(np.float32).reshape(-1, dim)
    distinct = unique_keys(keys).size
    if distinct != keys.size:
        raise InputError(
            f"{pred_dir}: {keys.size - distinct} keys appear more than once; dump "
            "the items with unique_keys=True so each item has one vector"
        )
    return keys, np.ascontiguousarray(vectors)


def build_index(
    pred_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    column: str = "item_vec",
    spec: IndexSpec | None = None,
) -> Path:
    """Build an index of every vector in ``pred_dir`` (a complete prediction folder).

    Raises:
        ConfigError: faiss missing; CheckpointError: ``pred_dir`` incomplete;
        InputError: no such column, repeated keys, no items.
    """
    faiss = _faiss()
    spec = spec or IndexSpec()
    keys, vectors = _item_vectors(pred_dir, column)
    n, dim = vectors.shape
    if n == 0:
        raise InputError(f"{pred_dir}: no item vectors to index")
    metric = faiss.METRIC_INNER_PRODUCT if spec.metric == "ip" else faiss.METRIC_L2
    nlist = None
    if spec.kind == "flat":
        index = faiss.IndexFlatIP(dim) if spec.metric == "ip" else faiss.IndexFlatL2(dim)
    elif spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, metric)
    else:
        nlist = spec.nlist or max(1, min(int(4 * np.sqrt(n)), n // 8))
        quantizer = faiss.IndexFlatIP(dim) if spec.metric == "ip" else faiss.IndexFlatL2(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, metric)
        index.train(vectors)
        index.nprobe = min(spec.nprobe, nlist)
    index.add(vectors)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / INDEX_META).unlink(missing_ok=True)  # incomplete until rewritten, last
    faiss.write_index(index, str(out_dir / "index.faiss"))
    np.save(out_dir / "keys.npy", keys)
    meta = {**asdict(spec), "nlist": nlist, "dim": dim, "items": n,
            "source": str(pred_dir), "vector_column": column}  # fmt: skip
    with replaced_atomically(out_dir / INDEX_META) as tmp:
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    log.info("index %s: %d items of dim %d (%s, %s)", out_dir, n, dim, spec.kind, spec.metric)
    return out_dir


class RecallIndex:
    """A built index: ``search(user_vectors, k) -> (item keys [q, k], scores [q, k])``."""

    def __init__(self, index_dir: str | os.PathLike) -> None:
        faiss = _faiss()
        self.dir = Path(index_dir)
        meta_path = self.dir / INDEX_META
        if not meta_path.is_file():
            raise CheckpointError(f"{self.dir}: no {INDEX_META}; not a complete index")
        self.meta = json.loads(meta_path.read_text())
        self.index = faiss.read_index(str(self.dir / "index.faiss"))
        if self.meta["kind"] == "ivf":
            self.index.nprobe = min(self.meta["nprobe"], self.meta["nlist"])
        self.keys = np.load(self.dir / "keys.npy")

    def search(self, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` items of each query vector (``[q, dim]`` float32); keys are uint64.

        Where fewer than ``k`` items are found, keys are 0 and scores NaN.
        """
        queries = np.ascontiguousarray(queries, np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.meta["dim"]:
            raise InputError(
                f"RecallIndex.search: queries must be [q, {self.meta['dim']}], got {queries.shape}"
            )
        scores, rows = self.index.search(queries, int(k))
        missing = rows < 0
        keys = self.keys[np.where(missing, 0, rows)]
        keys[missing] = 0
        scores = scores.astype(np.float32)
        scores[missing] = np.nan
        return keys, scores


def brute_force_top_k(queries: np.ndarray, keys: np.ndarray, vectors: np.ndarray, k: int,
                      metric: str = "ip") -> np.ndarray:  # fmt: skip
    """Exact top-``k`` item keys per query (numpy), the reference an index is measured by."""
    q = np.asarray(queries, np.float32)
    if metric == "ip":
        scores = q @ vectors.T
    else:
        scores = -((q[:, None, :] - vectors[None, :, :]) ** 2).sum(-1)
    k = min(k, vectors.shape[0])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return keys[top]


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of ``|found ∩ exact| / |exact|`` (rows of item keys)."""
    if exact.size == 0:
        return 1.0
    hits = [np.intersect1d(f, e).size for f, e in zip(found, exact, strict=True)]  # per query
    return float(np.sum(hits) / exact.size)
