"""Elastic jobs (issue 23): placement-routed clients and live migration of virtual shards.

See docs/elastic.md. :class:`ElasticClient` routes by the servers' placement and resends
what a server refuses after a placement change; :func:`scale` moves virtual shards
between running servers while training continues.
"""

from .client import ElasticClient
from .migrate import MigrationReport, install_placement, migrate, scale

__all__ = ["ElasticClient", "MigrationReport", "install_placement", "migrate", "scale"]
