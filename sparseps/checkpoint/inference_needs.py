"""What ``save_inference_model`` needs, checked when a trainer is made and learned as it trains.

It needs two things:

- **a model it can export**: a :class:`~sparseps.nn.SparseModel` (embeddings with fixed
  slots and a pooling, a ``head(dense, *pooled)`` whose dense width can be found). The
  trainer checks this when it is made (:func:`~.inference.export_problem`, cheap: a few
  calls of a copy of the head on zeros of two rows), so a job hears before its first pass,
  not after it, that its inference saves will fail, and how to fix the model. A model
  that cannot be exported still trains (a job may never save an inference model): the
  problem is logged once as a warning, and ``save_inference_model`` raises it at once,
  before any server is asked for anything.
- **the data the model was trained on** (:class:`~.model_input.ModelInput`), recorded in
  the save so that ``sparseps predict`` and ``sparseps serve`` read rows as training
  did: learned from each dataset the trainer trains on, the latest one winning; restored
  by ``load_checkpoint`` when the trainer has not trained yet.
"""

from __future__ import annotations

import logging

from ..errors import CheckpointError
from .inference import export_problem
from .model_input import ModelInput

__all__ = ["InferenceNeeds"]

log = logging.getLogger(__name__)


class InferenceNeeds:
    """A trainer's readiness for ``save_inference_model`` (see the module docstring).

    Attributes:
        problem: why the model cannot be exported, or None.
        input: the data the model was trained on, or None (not learned: the trainer has
            trained on no sparseps dataset yet). Set it to record another.
    """

    def __init__(self, problem: str | None = None, input: ModelInput | None = None) -> None:
        self.problem = problem
        self.input = input

    @classmethod
    def of(cls, model: object) -> InferenceNeeds:
        """Check ``model`` now; a model that cannot be exported is logged (a warning)."""
        problem = export_problem(model)
        if problem is not None:
            log.warning("save_inference_model will refuse this model: %s", problem)
        return cls(problem)

    def trained_on(self, dataset: object) -> None:
        """Record the input of a dataset the trainer trains on (another iterable: nothing)."""
        found = ModelInput.of_dataset(dataset)
        if found is None:
            return
        if self.input is not None and found.schema != self.input.schema:
            log.info(
                "training on another schema than the previous pass; inference saves record "
                "the latest: %s",
                found.describe(),
            )
        self.input = found

    def restore(self, record: object) -> None:
        """Adopt a checkpoint's record of the input, unless this trainer learned one."""
        if self.input is None and record is not None:
            self.input = ModelInput.from_dict(record)

    def require(self) -> None:
        """Raises:
        CheckpointError: the model cannot be exported (the problem found when it was made).
        """
        if self.problem is not None:
            raise CheckpointError(self.problem)
