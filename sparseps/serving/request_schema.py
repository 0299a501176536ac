"""Which columns a request holds: the schema given (``--schema``) or the model's own.

By default the service takes the schema its model was trained on, as the save records it
(:mod:`sparseps.checkpoint.model_input`): the first model served fixes it for the life of
the service, since clients are built against it. A later save whose record names another
schema is refused, like a corrupt one (the service keeps serving; restart it to serve the
new schema). A save that records no schema (made before saves recorded it) is served with
the Criteo columns, and the log says so. ``--schema`` fixes the columns instead; every
save is then served with them, as long as they feed the model.

Every model is tried on a one-row request of the columns before it is served (the
warm-up). The first model served also fixes how many predictions a row gets (its head's
outputs: 2 for a two-task model such as ESMM's pCTR and pCVR), since clients read the
answer's shape: a later save whose head has another count is refused the same way.
"""

from __future__ import annotations

import json
import logging

from ..checkpoint.predictor import Predictor
from ..data.schema import CRITEO, Schema
from ..errors import CheckpointError, InputError
from .requests import batch_from_body

__all__ = ["RequestSchema"]

log = logging.getLogger(__name__)


class RequestSchema:
    """The service's request columns (see the module docstring).

    Args:
        given: the schema given on the command line, or None for the model's.
    """

    def __init__(self, given: Schema | None) -> None:
        self.given = given
        self._fixed: Schema | None = given
        self._outputs: int | None = None  # predictions per row, from the first warm-up

    @property
    def schema(self) -> Schema:
        """The columns requests hold (known once :meth:`fix` has run, or when given)."""
        if self._fixed is None:
            raise RuntimeError("RequestSchema.fix() first: the model decides the columns")
        return self._fixed

    def of(self, predictor: Predictor) -> Schema:
        """The columns ``predictor`` would be served with."""
        if self._fixed is not None:
            return self._fixed
        recorded = predictor.input
        return CRITEO if recorded is None else recorded.schema

    def fix(self, predictor: Predictor) -> Schema:
        """Take the first served model's columns for good; returns them."""
        if self._fixed is None:
            if predictor.input is None:
                log.info(
                    "%s records no input schema (saved before inference models recorded "
                    "it): serving the Criteo request columns; --schema picks others",
                    predictor.saves[-1],
                )
            self._fixed = self.of(predictor)
        return self._fixed

    def warm_up(self, predictor: Predictor) -> None:
        """One prediction of a one-row request before ``predictor`` is served.

        Raises:
            CheckpointError: the save records another schema than the one served, the
                columns do not feed it, or its head gives another number of predictions
                per row than the served one.
        """
        schema = self.of(predictor)
        recorded = predictor.input
        if self.given is None and recorded is not None and recorded.schema != schema:
            raise CheckpointError(
                f"{predictor.saves[-1]}: the model now expects {recorded.describe()}, and "
                "the service serves other request columns; restart sparseps serve to serve "
                "the new schema"
            )
        try:
            predictor.check_schema(schema, what="the service's request columns")
        except InputError as exc:
            raise CheckpointError(f"{predictor.saves[-1]}: {exc}") from None
        row = {schema.slots[0]: "warmup"} if schema.slots else {}
        batch = batch_from_body(json.dumps({"rows": [row]}).encode(), "", schema, max_rows=1)
        answer = predictor.predict_batch(batch)
        outputs = 1 if answer.ndim == 1 else int(answer.shape[1])
        if self._outputs is None:
            self._outputs = outputs
        elif outputs != self._outputs:
            raise CheckpointError(
                f"{predictor.saves[-1]}: the head gives {outputs} predictions per row and "
                f"the service answers {self._outputs}; restart sparseps serve to serve the "
                "new head"
            )
