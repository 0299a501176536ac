"""Heterogeneous parameter server: IO and embeddings on CPU workers, the dense network on a
heter worker (docs/heterps.md).

- :mod:`.ops`: the wire schema of the heter worker's ops;
- :mod:`.wire`: a step's embedding outputs and their gradients as one flat buffer;
- :mod:`.service`: the heter worker (role ``heter_worker``): runs the dense network;
- :mod:`.mode`: the trainer side (``HeterMode``): sends steps, applies what comes back.
"""

from .mode import HeterMode
from .service import HeterService, serve_from_env

__all__ = ["HeterMode", "HeterService", "serve_from_env"]
