"""``ElasticClient``: a :class:`~sparseps.rpc.client.PSClient` that requires a placement.

Every ``PSClient`` that follows placements (the default, a launched job's trainers too)
holds a placement router (:mod:`sparseps.elastic.routing`) and switches to it once it
finds its servers hold a placement. This class hands the client that router itself and
insists that the servers already hold a placement, and keeps the name ``retry_for`` the
migration tests and the bench use.

Example::

    with ElasticClient(endpoints) as client:
        client.create_table(TableConfig(name="emb", dim=8))
        rows = client.pull("emb", keys).wait()
        client.push("emb", keys, grads).wait()
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputError
from ..rpc.client import PSClient
from .routing import PlacementRouter

__all__ = ["ElasticClient"]


class ElasticClient(PSClient):
    """Pull/push on an elastic job (its servers hold a placement: :func:`install_placement`).

    Args:
        endpoints: the job's server addresses, rank order, at least its first ranks (the
            placement names the rest; dense tables are placed over this list).
        timeout: seconds per request.
        job_id: the job's id, if its servers check one.
        retry_for: seconds a refused request is resent for before the call fails
            (``PSClient(placement_retry_s=...)``).

    Raises:
        InputError: the servers hold no placement.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 30.0,
                 job_id: str | None = None, retry_for: float = 60.0) -> None:  # fmt: skip
        super().__init__(list(endpoints), timeout=timeout, job_id=job_id,
                         placement_retry_s=retry_for, follow_placement=True,
                         placement_routing=PlacementRouter)  # fmt: skip
        try:
            found = self.refresh_placement()
        except BaseException:
            self.close()
            raise
        if found is None:
            self.close()
            raise InputError(f"ElasticClient: the servers {list(endpoints)} hold no placement; "
                             "install one with sparseps.elastic.install_placement")  # fmt: skip

    @property
    def retry_for(self) -> float:
        return self.placement_retry_s
