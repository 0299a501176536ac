"""Built-in models used by ``sparseps demo``, the benchmarks and the examples."""

from .deepfm import DeepFM
from .dnn import DNN
from .two_tower import InBatchSoftmax, TwoTower
from .wide_deep import WideDeep

__all__ = ["DNN", "DeepFM", "InBatchSoftmax", "TwoTower", "WideDeep"]
