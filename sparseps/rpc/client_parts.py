"""What the parts of :class:`~sparseps.rpc.client.PSClient` use of each other, declared once.

PSClient is assembled from mixins (``client_tables``, ``client_dense``, ``client_rows``,
``client_cluster``, ``placed``, ``table_wide``), and each calls methods or reads
attributes another part defines (the channel and the request helpers in ``client.py``,
routing in ``placed.py``).
Every mixin derives from :class:`ClientParts`, which declares those names for the type
checker only: at run time it is an empty class, and PSClient's own definitions are the
ones that run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from ..core.placement import Placement
    from .channel import Channel
    from .replicated import ShardRequest
    from .shard_views import ShardViews

__all__ = ["ClientParts"]


class ClientParts:
    """The names the PSClient mixins share (declarations only; see the module docstring)."""

    if TYPE_CHECKING:
        # client.py: the connection and its settings
        _channel: Channel
        endpoints: tuple[str, ...]
        replicas: int
        timeout: float
        file_timeout: float
        # placed.py: the placement this client routes by (None: plain routing)
        _routing: tuple[Placement, np.ndarray] | None

        @property
        def num_servers(self) -> int: ...

        # client.py: requests to every server, to one shard's copies, to every shard
        def _all(self, op: str, table: str | None = None, args: dict | None = None,
                 timeout: float | None = None, ranks=None) -> list: ...  # fmt: skip
        def _shard_request(self, shard: int, op: str, table: str | None, bufs=(),
                           args=None) -> ShardRequest: ...  # fmt: skip
        def _each_shard(self, op: str, table: str | None, args: dict | None = None, *,
                        timeout: float | None = None, shards=None) -> list: ...  # fmt: skip

        views: ShardViews

        # placed.py: the placement and its refresh (the keyed ops' ``_group`` and
        # ``_keyed`` are declared where they are used, client_rows.py: this module imports
        # nothing of placed.py, which derives from it)
        placement_retry_s: float
        move_waits: int

        @property
        def placement(self) -> Placement | None: ...

        def refresh_placement(self) -> Placement | None: ...
        def _probe_placement(self) -> None: ...
        def _table_ranks(self) -> list[int] | None: ...

        # table_wide.py: table-wide ops under a placement
        def _table_wide(self, op: str, table: str | None, args: dict | None,
                        timeout: float | None, pick: Callable) -> list: ...  # fmt: skip
