"""PaddleRec's ``models/rank/slot_dnn/static_model.py`` in sparseps.

``StaticModel`` reads its hyper-parameters from the config as PaddleRec's does; its
feeds become a :class:`sparseps.data.Schema` (names and ``use_var`` order), its ``net`` a
torch :class:`~net.BenchmarkDNNLayer` over the table ``table_parameters.embedding``
describes, its optimizer a sparseps rule. Paddle lines are kept as comments above their
sparseps lines.
"""

from __future__ import annotations

import sparseps as sps
from sparseps.data import Schema

from net import BenchmarkDNNLayer
from table_parameters import table_config

TABLE = "embedding"  # param_attr=paddle.ParamAttr(name="embedding")


class StaticModel:
    def __init__(self, config):
        self.cost = None
        self.infer_target_var = None
        self.config = config
        self._init_hyper_parameters()
        self.sync_mode = config.get("runner.sync_mode")

    def _init_hyper_parameters(self):
        self.dict_dim = self.config.get("hyper_parameters.dict_dim")
        self.emb_dim = self.config.get("hyper_parameters.emb_dim")
        self.slot_num = self.config.get("hyper_parameters.slot_num")
        self.learning_rate = float(self.config.get("hyper_parameters.optimizer.learning_rate"))
        self.layer_sizes = self.config.get("hyper_parameters.layer_sizes")

    def create_feeds(self, is_infer=False):
        # slot_ids = [paddle.static.data(name=str(i), shape=[None, 1], dtype="int64",
        #             lod_level=1) for i in range(2, self.slot_num + 2)]
        # show = paddle.static.data(name="show", ...); label = paddle.static.data(name="click", ...)
        # feeds_list = [show, label] + slot_ids
        #   sparseps: a Schema of the same names in the same (use_var) order. The reader's
        #   slots are matched to it by position, as in Paddle: it yields 0 (show), 1 (click)
        #   and 2..slot_num+1, read as show, click and 2..slot_num+1. The show feed is
        #   skipped: the worker pushes one show per instance, which is all it holds.
        slots = tuple(str(i) for i in range(2, self.slot_num + 2))
        return Schema(label="click", dense=(), slots=slots,
                      multislot_order=("show", "click", *slots))  # fmt: skip

    def table(self):
        """The sparseps table of ``table_parameters.embedding`` (the accessor's settings)."""
        return table_config(TABLE, self.config["table_parameters"][TABLE],
                            emb_dim=int(self.emb_dim), cvm=True)  # fmt: skip

    def net(self, input, is_infer=False):
        # dnn_model = BenchmarkDNNLayer(self.dict_dim, self.emb_dim, self.slot_num,
        #     self.layer_sizes, sync_mode=self.sync_mode)
        # self.predict = dnn_model.forward(self.show_input, self.label_input, self.slot_inputs)
        return BenchmarkDNNLayer(self.dict_dim, self.emb_dim, self.slot_num, self.layer_sizes,
                                 sync_mode=self.sync_mode, slots=input.slots, table=self.table())  # fmt: skip
        # auc (paddle.static.auc), ctr_metric_bundle, cost (log_loss of predict, mean):
        # every pass's MetricResult and the trainer's default loss (binary cross-entropy
        # of the logit)

    def create_optimizer(self, strategy=None):
        # optimizer = paddle.optimizer.Adam(learning_rate=self.learning_rate, lazy_mode=True)
        #   the dense parameters' rule; the sparse table's rules are its accessor's
        #   (embed_sgd_param, embedx_sgd_param), as in Paddle's parameter server
        return sps.optim.Adam(lr=self.learning_rate)
