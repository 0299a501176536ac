"""The built-in models' CvmNorm: the slots' cvm features normalised, then scaled to about
the embeddings' size (0.1: bench/RESULTS.md, "the CTR accessor's trade-off curve"), the
embedding columns passed through unchanged."""

from __future__ import annotations

import torch

from sparseps.models._blocks import CvmNorm


def _pooled(batch: int = 4096, slots: int = 3, dim: int = 4) -> torch.Tensor:
    """``[B, S, 2 + dim]`` as a cvm module gives it: log(show + 1) up to ~12, the log
    click ratio, then small embedding values."""
    g = torch.Generator().manual_seed(0)
    show = torch.log1p(torch.randint(0, 100_000, (batch, slots, 1), generator=g).float())
    ratio = -torch.rand(batch, slots, 1, generator=g) * 4
    emb = (torch.rand(batch, slots, dim, generator=g) - 0.5) * 0.1
    return torch.cat([show, ratio, emb], dim=2)


def test_cvm_features_are_normalised_then_scaled_and_embeddings_pass_through():
    pooled = _pooled()
    norm = CvmNorm(3, cvm=True).train()
    out = norm(pooled)
    assert out.shape == (4096, 3 * 2 + 3 * 4)
    counts = out[:, :6]
    torch.testing.assert_close(counts.mean(0), torch.zeros(6), atol=1e-4, rtol=0)
    torch.testing.assert_close(counts.std(0, unbiased=False), torch.full((6,), 0.1), atol=1e-3,
                               rtol=0)  # fmt: skip
    torch.testing.assert_close(out[:, 6:], pooled[:, :, 2:].flatten(1), atol=0, rtol=0)
    unit = CvmNorm(3, cvm=True, scale=1.0).train()(pooled)[:, :6]
    torch.testing.assert_close(counts, unit * 0.1, atol=1e-6, rtol=0)


def test_without_cvm_it_only_flattens():
    pooled = _pooled()
    torch.testing.assert_close(CvmNorm(3, cvm=False)(pooled), pooled.flatten(1), atol=0, rtol=0)
