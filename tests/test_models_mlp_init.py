"""The built-in models' dense layers: PyTorch's default initialisation or Keras's
(Glorot-uniform weights, zero biases: what the TensorFlow and Paddle peers start from),
chosen by ``mlp_init`` (issue 55, docs/training.md "Defaults")."""

from __future__ import annotations

import math

import pytest
import torch

from sparseps.data import CRITEO
from sparseps.models import WideDeep
from sparseps.models._blocks import mlp


def test_glorot_bounds_weights_by_fan_in_plus_fan_out_and_zeroes_biases():
    torch.manual_seed(0)
    net = mlp(221, [400, 400], init="glorot")
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(221, 400), (400, 400), (400, 1)]
    for layer in linears:
        bound = math.sqrt(6.0 / (layer.in_features + layer.out_features))
        w = layer.weight.detach()
        assert w.abs().max() <= bound
        assert w.abs().max() > 0.9 * bound  # uniform over the whole range, not a smaller one
        assert torch.count_nonzero(layer.bias) == 0


def test_torch_init_is_pytorchs_default_and_same_draws_as_before():
    torch.manual_seed(0)
    net = mlp(221, [400], init="torch")
    torch.manual_seed(0)
    plain = [torch.nn.Linear(221, 400), torch.nn.Linear(400, 1)]
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    for got, want in zip(linears, plain, strict=True):
        torch.testing.assert_close(got.weight, want.weight, atol=0, rtol=0)
        torch.testing.assert_close(got.bias, want.bias, atol=0, rtol=0)
    assert isinstance(net[1], torch.nn.ReLU) and len(net) == 3


def test_wide_deep_passes_mlp_init_to_its_head_and_rejects_unknown_names():
    model = WideDeep(CRITEO.slots, len(CRITEO.dense), mlp_init="glorot")
    first = model.head.deep[0]
    assert torch.count_nonzero(first.bias) == 0
    assert torch.count_nonzero(model.head.wide_dense.bias) == 0
    with pytest.raises(ValueError, match="mlp init 'keras'"):
        WideDeep(CRITEO.slots, len(CRITEO.dense), mlp_init="keras")
