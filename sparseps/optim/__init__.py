"""Server-side optimizer rules for sparse rows and dense vectors.

Each rule is a frozen, validated dataclass with ``name``, ``state_dim(dim)``,
``to_dict()`` and a compiled batch ``update``; ``rule_from_dict`` rebuilds one from its
dict. Sparse tables accept every rule; ``DenseTable`` accepts SGD, Adagrad and Adam.

==================  ================  =====================================================
rule                state per row     reference semantics
==================  ================  =====================================================
``SGD``             0                 torch.optim.SGD (weight_decay = l2)
``Adagrad``         dim               torch.optim.Adagrad (lr_decay = 0)
``RowwiseAdagrad``  1                 FBGEMM exact row-wise Adagrad (mean of g**2)
``Adam``            2*dim + 1         torch.optim.Adam per row, per-row step counter
``FTRL``            2*dim             FTRL-proximal, McMahan et al. 2013
``SparseAdagrad``   1                 Paddle's SparseAdaGradSGDRule (one g2sum per row)
==================  ================  =====================================================
"""

from __future__ import annotations

from .adagrad import Adagrad
from .adam import Adam
from .base import RULES, Rule, rule_from_dict
from .ftrl import FTRL
from .rowwise_adagrad import RowwiseAdagrad
from .sgd import SGD
from .sparse_adagrad import SparseAdagrad

__all__ = [
    "DENSE_RULES",
    "FTRL",
    "RULES",
    "SGD",
    "Adagrad",
    "Adam",
    "Rule",
    "RowwiseAdagrad",
    "SparseAdagrad",
    "rule_from_dict",
]

#: rules a DenseTable accepts
DENSE_RULES = (SGD, Adagrad, Adam)
