"""Built-in models used by ``sparseps demo``, the benchmarks and the examples."""

from .deepfm import DeepFM
from .dnn import DNN
from .wide_deep import WideDeep

__all__ = ["DNN", "DeepFM", "WideDeep"]
