"""sparseps: a parameter server for CTR and recommendation models with huge sparse embeddings.

This module is the public front door: everything a user needs is re-exported here and
listed in ``__all__`` (pinned by ``tests/test_exports.py``).
"""

from __future__ import annotations

from . import errors
from .errors import (
    CheckpointError,
    ConfigError,
    InputError,
    ProtocolError,
    RemoteError,
    SparsePSError,
    TimeoutError_,
    UnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InputError",
    "ProtocolError",
    "RemoteError",
    "SparsePSError",
    "TimeoutError_",
    "UnavailableError",
    "__version__",
    "errors",
]
