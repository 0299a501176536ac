"""PaddleRec's ``models/rank/slot_dnn/net.py`` (``BenchmarkDNNLayer``) as a sparseps model.

Paddle's layer looks every slot up with ``paddle.static.nn.sparse_embedding(size=[dict_dim,
emb_dim], padding_idx=0, entry=ShowClickEntry(show, click), param_attr="embedding")``: one
server table named ``embedding`` whose accessor (``table_parameters.embedding`` of the
config) holds each feature's show/click, ``embed_w`` and, once the feature's score passes
``embedx_threshold``, its embedx part. It sum-pools each slot, concatenates the slots and
runs an MLP of ``layer_sizes``, then ``sigmoid(clip(y, -15, 15))``.

Here the lookup is one :class:`sparseps.nn.SparseEmbedding` over that table (its
config from ``table_parameters``: ``tools/utils/static_ps/table_parameters.py``) with
``cvm=True``: each slot gives the model ``log(show + 1)`` and ``log(click + 1) -
log(show + 1)`` of its pooled counts (Paddle's ``cvm`` op) in front of its pooled
``[embed_w, embedx]``; the rest is the head an inference model exports. The show and
click the servers count are pushed by the worker with each instance (one show each, a
click for label 1: what ``ShowClickEntry`` feeds from the reader's ``show`` and
``click``).
"""

from __future__ import annotations

import torch
from torch import nn

import sparseps as sps


class BenchmarkDNNHead(nn.Module):
    """The dense part: ``(dense [B, 0], slot_embs [B, slot_num, width]) -> logit [B, 1]``."""

    def __init__(self, width, slot_num, layer_sizes):
        super().__init__()
        # self._init_range = 0.2
        init_range = 0.2
        # sizes = [emb_dim * slot_num] + self.layer_sizes + [1]  (width: emb_dim + 2 cvm)
        sizes = [width * slot_num, *layer_sizes, 1]
        # acts = ["relu" for _ in range(len(self.layer_sizes))] + [None]
        layers: list[nn.Module] = []
        for i in range(len(layer_sizes) + 1):
            # linear = paddle.nn.Linear(in_features=sizes[i], out_features=sizes[i + 1],
            #     weight_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.Normal(
            #         std=self._init_range / (sizes[i] ** 0.5))))   (bias: Paddle's zeros)
            linear = nn.Linear(sizes[i], sizes[i + 1])
            nn.init.normal_(linear.weight, 0.0, init_range / sizes[i] ** 0.5)
            nn.init.zeros_(linear.bias)
            layers.append(linear)
            if i < len(layer_sizes):  # acts[i] == 'relu'
                layers.append(nn.ReLU())
        self._mlp_layers = nn.Sequential(*layers)

    def forward(self, dense, slot_embs):
        # y_dnn = paddle.concat(x=embs, axis=1)   (embs: each slot's sum-pooled bow)
        y_dnn = slot_embs.flatten(1)
        # for n_layer in self._mlp_layers: y_dnn = n_layer(y_dnn)
        y_dnn = self._mlp_layers(y_dnn)
        # self.predict = F.sigmoid(paddle.clip(y_dnn, min=-15.0, max=15.0))
        #   the logit, clipped: the loss and the predictor apply the sigmoid
        return torch.clamp(y_dnn, -15.0, 15.0)


class BenchmarkDNNLayer(sps.nn.SparseModel):
    """PaddleRec's ``BenchmarkDNNLayer``: the lookup as ``embeddings``, the rest as ``head``."""

    def __init__(self, dict_dim, emb_dim, slot_num, layer_sizes, sync_mode=None, *, slots,
                 table):  # fmt: skip
        super().__init__()
        # emb = paddle.static.nn.sparse_embedding(input=s_input, size=[self.dict_dim,
        #     self.emb_dim], padding_idx=0, entry=self.entry,
        #     param_attr=paddle.ParamAttr(name="embedding"))
        # bow = paddle.static.nn.sequence_pool(input=emb, pool_type='sum')
        #   dict_dim: none (rows are made on first use); padding_idx=0: none (id 0, the
        #   reader's pad of an empty slot, is one row like any other, shared by the slots)
        if table.dim != emb_dim:
            raise ValueError(f"table {table.name!r} is {table.dim} wide, emb_dim is {emb_dim}")
        embedding = sps.nn.SparseEmbedding(
            table.name, table.dim, slots=slots, pooling="sum", rule=table.rule,
            initializer=table.initializer, lifecycle=table.lifecycle, seed=table.seed,
            accessor=table.accessor, cvm=table.accessor.cvm,
        )  # fmt: skip
        self.embeddings = nn.ModuleList([embedding])
        self.head = BenchmarkDNNHead(embedding.output_dim, slot_num, list(layer_sizes))
