"""The environment a test or a tool gives a job it starts."""

from __future__ import annotations

import os
from pathlib import Path

from ..env import ZYGOTE_DIR, process_environ

__all__ = ["CHECKOUT", "clean_environ"]

# the folder holding the sparseps package: the checkout, for an editable install
CHECKOUT = Path(__file__).resolve().parents[2]


def clean_environ(**extra: str) -> dict[str, str]:
    """This process's environment without its ``SPARSEPS_*`` variables (the caller may run
    inside a job: its role must not leak into the one it starts) but the zygotes' folder,
    with :data:`CHECKOUT` first on ``PYTHONPATH`` (the job imports this sparseps whatever
    its working directory), plus ``extra``."""
    env = {
        k: v
        for k, v in process_environ().items()
        if not k.startswith("SPARSEPS_") or k == ZYGOTE_DIR
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env
