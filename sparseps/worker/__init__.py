"""The worker side: SparseEmbedding, the trainer, training modes and the IO pipeline."""
