"""PaddleRec's ``models/rank/wide_deep/net.py`` as a ``sparseps.nn.SparseModel``.

Paddle's ``WideDeepLayer`` looks every slot up in one ``paddle.nn.Embedding(..., sparse=True,
name="SparseFeatFactors")``, which a parameter-server job holds on the servers; then a
wide linear part on the dense input and an MLP over the embeddings and the dense input.
Here the lookup is one :class:`sparseps.nn.SparseEmbedding` (table ``SparseFeatFactors``,
all 26 slots) and the rest is the head that ``save_inference_model`` exports. Paddle
lines are kept as comments above their torch lines.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import sparseps as sps


class WideDeepHead(nn.Module):
    """The dense part: ``(dense_inputs [B, 13], sparse_embs [B, 26, dim]) -> logit [B, 1]``."""

    def __init__(self, sparse_feature_dim, dense_feature_dim, num_field, layer_sizes):
        super().__init__()
        # self.wide_part = paddle.nn.Linear(in_features=self.dense_feature_dim, out_features=1,
        #     weight_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.TruncatedNormal(
        #         mean=0.0, std=1.0 / math.sqrt(self.dense_feature_dim))))
        self.wide_part = _linear(dense_feature_dim, 1, truncated=True)
        # sizes = [sparse_feature_dim * num_field + dense_feature_dim] + self.layer_sizes + [1]
        sizes = [sparse_feature_dim * num_field + dense_feature_dim, *layer_sizes, 1]
        # acts = ["relu" for _ in range(len(self.layer_sizes))] + [None]
        layers: list[nn.Module] = []
        for i in range(len(layer_sizes) + 1):
            # linear = paddle.nn.Linear(in_features=sizes[i], out_features=sizes[i + 1],
            #     weight_attr=...Normal(std=1.0 / math.sqrt(sizes[i])))
            layers.append(_linear(sizes[i], sizes[i + 1]))
            if i < len(layer_sizes):  # acts[i] == 'relu'
                layers.append(nn.ReLU())
        self._mlp_layers = nn.Sequential(*layers)

    def forward(self, dense_inputs, sparse_embs):
        # wide_output = self.wide_part(dense_inputs)
        wide_output = self.wide_part(dense_inputs)
        # emb = paddle.reshape(emb, shape=[-1, self.sparse_feature_dim]) per slot, then
        # deep_output = paddle.concat(x=sparse_embs + [dense_inputs], axis=1)
        deep_output = torch.cat([sparse_embs.flatten(1), dense_inputs], dim=1)
        # for n_layer in self._mlp_layers: deep_output = n_layer(deep_output)
        deep_output = self._mlp_layers(deep_output)
        # prediction = paddle.add(x=wide_output, y=deep_output); pred = F.sigmoid(prediction)
        return wide_output + deep_output  # the logit: the loss and the predictor apply sigmoid


def _linear(fan_in: int, fan_out: int, *, truncated: bool = False) -> nn.Linear:
    """A ``paddle.nn.Linear`` as PaddleRec initializes it: weights ~ N(0, 1/sqrt(fan_in))
    (truncated at 2 std for the wide part), biases 0 (Paddle's default)."""
    linear = nn.Linear(fan_in, fan_out)
    std = 1.0 / math.sqrt(fan_in)
    if truncated:
        nn.init.trunc_normal_(linear.weight, 0.0, std, -2 * std, 2 * std)
    else:
        nn.init.normal_(linear.weight, 0.0, std)
    nn.init.zeros_(linear.bias)
    return linear


class WideDeepLayer(sps.nn.SparseModel):
    """PaddleRec's ``WideDeepLayer``: the lookup as ``embeddings``, the rest as ``head``."""

    def __init__(self, sparse_feature_number, sparse_feature_dim, dense_feature_dim, num_field,
                 layer_sizes, sync_mode="", *, slots, rule):  # fmt: skip
        super().__init__()
        # self.embedding = paddle.nn.Embedding(self.sparse_feature_number,
        #     self.sparse_feature_dim, sparse=True, weight_attr=paddle.ParamAttr(
        #         name="SparseFeatFactors", initializer=paddle.nn.initializer.Uniform()))
        #   one server table for every slot (rows made on first use: no size), values
        #   uniform in [-1, 1) as Paddle's Uniform(), trained by the job's optimizer rule
        # emb = self.embedding(s_input) for s_input in sparse_inputs  (not "gpubox" mode)
        self.embeddings = nn.ModuleList([
            sps.nn.SparseEmbedding("SparseFeatFactors", sparse_feature_dim, slots=slots,
                                   rule=rule, initializer=sps.Initializer.uniform(-1.0, 1.0)),
        ])  # fmt: skip
        self.head = WideDeepHead(sparse_feature_dim, dense_feature_dim, num_field, layer_sizes)
