"""PaddleRec's ``models/rank/wide_deep/static_model.py`` in sparseps.

``StaticModel`` reads its hyper-parameters from the config as PaddleRec's does; its
feeds become a :class:`sparseps.data.Schema` (names and ``use_var`` order), its ``net`` a
torch :class:`~net.WideDeepLayer`, its optimizer a sparseps rule. Paddle lines are kept as
comments above their sparseps lines.
"""

from __future__ import annotations

import sparseps as sps
from sparseps.data import Schema

from net import WideDeepLayer


class StaticModel:
    def __init__(self, config):
        self.cost = None
        self.config = config
        self._init_hyper_parameters()
        self.sync_mode = config.get("runner.sync_mode")

    def _init_hyper_parameters(self):
        self.sparse_feature_number = self.config.get("hyper_parameters.sparse_feature_number")
        self.sparse_feature_dim = self.config.get("hyper_parameters.sparse_feature_dim")
        self.sparse_inputs_slots = self.config.get("hyper_parameters.sparse_inputs_slots")
        self.dense_input_dim = self.config.get("hyper_parameters.dense_input_dim")
        self.learning_rate = self.config.get("hyper_parameters.optimizer.learning_rate")
        self.fc_sizes = self.config.get("hyper_parameters.fc_sizes")

    def create_feeds(self, is_infer=False):
        # dense_input = paddle.static.data(name="dense_input", shape=[None, 13], dtype="float32")
        # sparse_input_ids = [paddle.static.data(name=str(i), shape=[None, 1], dtype="int64")
        #                     for i in range(1, self.sparse_inputs_slots)]
        # label = paddle.static.data(name="label", shape=[None, 1], dtype="int64")
        # feeds_list = [label] + sparse_input_ids + [dense_input]
        #   sparseps: a Schema of the same names, in the same (use_var) order. The reader's
        #   lines are matched to it by position, as in Paddle: it yields click, 1..26 and
        #   dense_feature (13 values), read as label, 1..26 and dense_input
        sparse = tuple(str(i) for i in range(1, self.sparse_inputs_slots))
        return Schema(
            label="label", dense=("dense_input",) * self.dense_input_dim, slots=sparse,
            dense_transform="raw", multislot_order=("label", *sparse, "dense_input"),
        )  # fmt: skip

    def net(self, input, is_infer=False):
        # wide_deep_model = WideDeepLayer(self.sparse_feature_number, self.sparse_feature_dim,
        #     self.dense_input_dim, sparse_number, self.fc_sizes, sync_mode=self.sync_mode)
        # pred = wide_deep_model.forward(self.sparse_inputs, self.dense_input, show_click)
        #   (show_click feeds only gpubox's continuous_value_model: sparseps pushes a row's
        #   shows and clicks with its gradient in every mode)
        return WideDeepLayer(
            self.sparse_feature_number, self.sparse_feature_dim, self.dense_input_dim,
            self.sparse_inputs_slots - 1, self.fc_sizes, sync_mode=self.sync_mode,
            slots=input.slots, rule=self.create_optimizer(),
        )  # fmt: skip
        # auc (paddle.static.auc), cost (log_loss of pred, mean): every pass's MetricResult
        # and the trainer's default loss (binary cross-entropy of the logit)

    def create_optimizer(self, strategy=None):
        # optimizer = paddle.optimizer.Adam(learning_rate=self.learning_rate, lazy_mode=True)
        #   (lazy_mode: only the rows a batch touched are updated, as sparseps' sparse Adam
        #   does; the dense parameters use the same rule)
        return sps.optim.Adam(lr=self.learning_rate)
