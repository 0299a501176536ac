"""The placement router a :class:`~sparseps.rpc.client.PSClient` gets when its maker
passes none: sparseps.elastic's (an elastic job's routing, docs/elastic.md).

A client takes its placement router by injection
(``PSClient(placement_routing=...)``): :mod:`sparseps.elastic` sits above this package
(:mod:`sparseps.layers`), and nothing here imports it, so the plain client never runs,
nor needs, elastic code. Most clients are made without one, though, by code that does not
know whether its job will be scaled (a trainer's: ``worker/state.py``), and every client
must follow a job that ``sparseps scale`` turns elastic under it. This module is that
default, and the one place below the top floor that names sparseps.elastic: it is
declared in :data:`sparseps.layers.WIRING`, and it imports sparseps.elastic when called
(as a client is made), never when this package is imported.

Pending (issue 53): once the code that makes clients passes the router itself
(``worker/state.py``, ``testing/cluster.py``), a client made without one follows no
placement and this module and its WIRING entry go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .router import PlacementRoutingFactory

__all__ = ["default_placement_routing"]


def default_placement_routing() -> PlacementRoutingFactory:
    """sparseps.elastic's placement router (its class: it makes one per client)."""
    from ..elastic.routing import PlacementRouter

    return PlacementRouter
