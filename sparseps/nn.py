"""``sparseps.nn``: PyTorch modules whose embedding rows live on the servers."""

from .worker.nn import POOLINGS, SparseEmbedding, SparseModel, dense_tensor

__all__ = ["POOLINGS", "SparseEmbedding", "SparseModel", "dense_tensor"]
