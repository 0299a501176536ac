"""sparseps: a parameter server for CTR and recommendation models with huge sparse embeddings.

This module is the public front door: everything a user needs is re-exported here and
listed in ``__all__`` (pinned by ``tests/test_exports.py``). Names that need PyTorch or
the compiled kernels are loaded on first use, so ``import sparseps`` and the command
line stay quick and nothing starts at import time.
"""

import importlib as _importlib
from typing import Any as _Any

from . import errors
from .errors import (
    CheckpointError,
    ConfigError,
    DeadlineError,
    InputError,
    ProtocolError,
    RemoteError,
    SparsePSError,
    UnavailableError,
)

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "Accessor": ("sparseps.config", "Accessor"),
    "Initializer": ("sparseps.config", "Initializer"),
    "Lifecycle": ("sparseps.config", "Lifecycle"),
    "TableConfig": ("sparseps.config", "TableConfig"),
    "PSClient": ("sparseps.rpc.client", "PSClient"),
    "Strategy": ("sparseps.worker.strategy", "Strategy"),
    "Mode": ("sparseps.worker.strategy", "Mode"),
    "Sync": ("sparseps.worker.strategy", "Sync"),
    "Async": ("sparseps.worker.strategy", "Async"),
    "Geo": ("sparseps.worker.strategy", "Geo"),
    "GpuPS": ("sparseps.worker.strategy", "GpuPS"),
    "Heter": ("sparseps.worker.strategy", "Heter"),
    "Hybrid": ("sparseps.worker.strategy", "Hybrid"),
    "Trainer": ("sparseps.worker.trainer", "Trainer"),
    "Predictor": ("sparseps.checkpoint.predictor", "Predictor"),
    "init": ("sparseps.role", "init"),
    "is_heter_worker": ("sparseps.role", "is_heter_worker"),
    "is_server": ("sparseps.role", "is_server"),
    "is_worker": ("sparseps.role", "is_worker"),
    "worker_index": ("sparseps.role", "worker_index"),
    "worker_num": ("sparseps.role", "worker_num"),
    "server_num": ("sparseps.role", "server_num"),
    "server_endpoints": ("sparseps.role", "server_endpoints"),
    "run_server": ("sparseps.role", "run_server"),
    "barrier_worker": ("sparseps.role", "barrier_worker"),
    "stop": ("sparseps.role", "stop"),
    "all_reduce": ("sparseps.metrics.stats", "all_reduce"),
    "data": ("sparseps.data", None),
    "metrics": ("sparseps.metrics", None),
    "models": ("sparseps.models", None),
    "nn": ("sparseps.nn", None),
    "online": ("sparseps.online", None),
    "optim": ("sparseps.optim", None),
    "testing": ("sparseps.testing", None),
}

__all__ = [
    "Accessor",
    "CheckpointError",
    "ConfigError",
    "DeadlineError",
    "Initializer",
    "InputError",
    "Lifecycle",
    "PSClient",
    "Predictor",
    "ProtocolError",
    "RemoteError",
    "SparsePSError",
    "Strategy",
    "Mode",
    "Sync",
    "Async",
    "Geo",
    "GpuPS",
    "Heter",
    "Hybrid",
    "TableConfig",
    "Trainer",
    "UnavailableError",
    "__version__",
    "all_reduce",
    "barrier_worker",
    "data",
    "errors",
    "init",
    "is_heter_worker",
    "is_server",
    "is_worker",
    "metrics",
    "models",
    "nn",
    "online",
    "optim",
    "run_server",
    "server_endpoints",
    "server_num",
    "stop",
    "testing",
    "worker_index",
    "worker_num",
]
assert set(__all__) >= set(_LAZY), "every lazy name is public"


def __getattr__(name: str) -> _Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'sparseps' has no attribute {name!r}") from None
    module = _importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
