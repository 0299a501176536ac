"""Recall (candidate retrieval): a faiss index over dumped item vectors, and its queries.

``trainer.predict_from_dataset(items, DIR, key="item", outputs=("item_vec",),
unique_keys=True)`` dumps one vector per item; :func:`build_index` (``sparseps
build-index DIR --out INDEX``) builds a faiss-cpu index from it; :class:`RecallIndex`
answers top-k queries for user vectors. faiss is the optional extra ``recall``
(``pip install sparseps[recall]``), imported only here, on first use.
"""

from __future__ import annotations

from .index import IndexSpec, RecallIndex, brute_force_top_k, build_index, recall_at_k

__all__ = ["IndexSpec", "RecallIndex", "brute_force_top_k", "build_index", "recall_at_k"]
