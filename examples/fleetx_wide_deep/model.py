"""FleetX's ``examples/wide_and_deep_dataset/model.py``, ported to a ``sparseps.nn.SparseModel``.

Paddle builds a static program: input variables, a ``WideDeepLayer`` whose ``forward``
looks up ``paddle.static.nn.sparse_embedding`` per slot, metrics and the cost. In sparseps
the model is a torch module split in two (docs/migrating-from-paddle.md, "Porting a
static-graph model", goes through it line by line):

- ``embeddings``: the ``sparse_embedding`` calls, one :class:`sparseps.nn.SparseEmbedding`
  per slot (each call makes a parameter of its own, so a table of its own), holding rows
  on the servers;
- ``head(dense, *pooled)``: everything after the lookups (wide part, MLP, their sum),
  returning the logit. This is what ``save_inference_model`` exports and what
  ``sparseps predict``/``sparseps serve`` run.

The inputs (``paddle.static.data``, in ``use_var`` order) become a
:class:`sparseps.data.Schema`; the metrics Paddle builds by hand (``acc``, ``auc``,
``mae``, ``mse``) are in every pass's ``MetricResult``; the cost (``log_loss`` of the
sigmoid) is the trainer's default loss (binary cross-entropy of the logit).
"""

from __future__ import annotations

import math

import torch
from torch import nn

import sparseps as sps
from sparseps.data import Schema


class WideDeepHead(nn.Module):
    """``WideDeepLayer``'s dense part: ``(dense [B, 13], *sparse_embs [B, 1, dim]) -> [B, 1]``."""

    def __init__(self, sparse_feature_dim, dense_feature_dim, num_field, layer_sizes):
        super().__init__()
        self.sparse_feature_dim = sparse_feature_dim
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

    def forward(self, dense_inputs, *sparse_embs):
        # wide_output = self.wide_part(dense_inputs)
        wide_output = self.wide_part(dense_inputs)
        # emb = paddle.reshape(emb, shape=[-1, self.sparse_feature_dim])  (one id per slot)
        embs = [emb.reshape(-1, self.sparse_feature_dim) for emb in sparse_embs]
        # deep_output = paddle.concat(x=sparse_embs + [dense_inputs], axis=1)
        deep_output = torch.cat([*embs, dense_inputs], dim=1)
        # for n_layer in self._mlp_layers: deep_output = n_layer(deep_output)
        deep_output = self._mlp_layers(deep_output)
        # prediction = paddle.add(x=wide_output, y=deep_output); pred = F.sigmoid(prediction)
        return wide_output + deep_output  # the logit: the loss and the predictor apply sigmoid


def _linear(fan_in: int, fan_out: int, *, truncated: bool = False) -> nn.Linear:
    """A ``paddle.nn.Linear`` as FleetX initializes it: weights ~ N(0, 1/sqrt(fan_in))
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
    """FleetX's ``WideDeepLayer``: the lookups as ``embeddings``, the rest as ``head``."""

    def __init__(self, sparse_feature_number, sparse_feature_dim, dense_feature_dim, num_field,
                 layer_sizes, *, learning_rate):  # fmt: skip
        super().__init__()
        # self.embedding = paddle.nn.Embedding(...)  -- made but never used by forward: gone
        # emb = paddle.static.nn.sparse_embedding(s_input, size=[1024, self.sparse_feature_dim])
        #   per slot: a server table each, rows made on first use (no size), initialized as
        #   Paddle's default (Xavier) for a [1024, dim] parameter, trained by the optimizer's
        #   rule (SGD) on the servers
        limit = math.sqrt(6.0 / (1024 + sparse_feature_dim))
        self.embeddings = nn.ModuleList(
            sps.nn.SparseEmbedding(
                f"C{i}", sparse_feature_dim, slots=(f"C{i}",),
                rule=sps.optim.SGD(lr=learning_rate),
                initializer=sps.Initializer.uniform(-limit, limit),
            )
            for i in range(1, num_field + 1)
        )  # fmt: skip
        self.head = WideDeepHead(sparse_feature_dim, dense_feature_dim, num_field, layer_sizes)


class WideDeepModel:
    """FleetX's ``WideDeepModel``: hyper-parameters, the inputs and the network."""

    def __init__(self, sparse_feature_number=1000001, sparse_inputs_slots=27, sparse_feature_dim=10,
                 dense_input_dim=13, fc_sizes=(400, 400, 400), learning_rate=0.0001):  # fmt: skip
        self.sparse_feature_number = sparse_feature_number
        self.sparse_inputs_slots = sparse_inputs_slots
        self.sparse_feature_dim = sparse_feature_dim
        self.dense_input_dim = dense_input_dim
        self.fc_sizes = list(fc_sizes)
        self.learning_rate = learning_rate

    def net(self, is_train=True):
        # dense_input = paddle.static.data(name="dense_input", shape=[None, 13], dtype="float32")
        # sparse_inputs = [paddle.static.data(name="C" + str(i), shape=[None, 1], lod_level=1,
        #                                     dtype="int64") for i in range(1, 27)]
        # label_input = paddle.static.data(name="label", shape=[None, 1], dtype="int64")
        # self.inputs = [dense_input] + sparse_inputs + [label_input]
        sparse = tuple("C" + str(i) for i in range(1, self.sparse_inputs_slots))
        self.inputs = Schema(
            label="label", dense=("dense_input",) * self.dense_input_dim, slots=sparse,
            dense_transform="raw", multislot_order=("dense_input", *sparse, "label"),
        )  # fmt: skip
        # wide_deep_model = WideDeepLayer(...); pred = wide_deep_model.forward(sparse_inputs,
        #     dense_input)
        self.model = WideDeepLayer(
            self.sparse_feature_number, self.sparse_feature_dim, self.dense_input_dim,
            self.sparse_inputs_slots - 1, self.fc_sizes, learning_rate=self.learning_rate,
        )  # fmt: skip
        # acc_metrics, auc_metrics, mae_metrics, mse_metrics: in every pass's MetricResult
        # cost = paddle.nn.functional.log_loss(input=pred, label=label_float); mean: the
        #   trainer's default loss, binary cross-entropy of the logit
        return self.model
