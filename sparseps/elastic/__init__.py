"""Elastic jobs (issue 23): placement-routed clients and live migration of virtual shards.

See docs/elastic.md. One module for each side of it:

- the client side: :mod:`.routing` (a client's routing by the servers' placement: keyed
  calls by owner, resending what a server refuses while shards move) and
  :mod:`.table_wide` (table-wide ops under a placement, :class:`MoveRaceError`);
  :class:`ElasticClient` (:mod:`.client`) is a client that requires a placement;
- the driver: :mod:`.migrate` (:func:`scale`, :func:`migrate`: move virtual shards
  between running servers while training continues) over :mod:`.peers` (its connections);
- the server side: :mod:`.server_moves` (a server's placement and the move ops, which
  the server's op table maps to it).
"""

from .client import ElasticClient
from .migrate import MigrationReport, install_placement, migrate, scale
from .table_wide import MoveRaceError

__all__ = ["ElasticClient", "MigrationReport", "MoveRaceError", "install_placement", "migrate",
           "scale"]  # fmt: skip
