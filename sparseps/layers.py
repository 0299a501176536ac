"""The layer order of the package, declared once (``tests/test_layers.py`` enforces it).

``LAYERS`` lists sparseps' top-level modules and packages from the bottom floor up. A
module may import modules of its own layer or of any layer below it, never one above,
and no chain of imports may come back to where it started (at module level, and between
top-level packages). Lazy imports inside functions count the same as top-level ones.

Why this order:

- ``errors`` is what everything raises; ``env`` (the only environment reader) and
  ``core`` (hashing and routing, argument checks, per-batch key lookup, worker
  collectives and their timeout rule) hold the rules that more than one package needs.
  ``observe`` (metrics families, stack dumps, diagnosis, the status page) sits with them:
  the worker collectives run a diagnosis when they time out, and servers, workers and
  the launcher record metrics; it imports only ``errors`` and ``env``.
- ``optim`` (server-side rules) sits below ``config`` because a ``TableConfig`` holds a
  rule; both validate fields with ``core.validate``.
- ``table``, ``metrics`` and ``data`` are leaves over the config. ``files`` holds the
  file formats (shard files, the dense file, the manifest, the writer lock) that the
  servers write and the checkpoint code reads.
- ``rpc`` is the wire and the client; ``server`` uses its protocol; ``launch`` starts
  processes and talks to servers through the client; ``role`` wires a process into a job
  (local mode starts a server through ``launch``, ``run_server`` runs ``server``).
- ``elastic`` (placement-routed clients, live moves of virtual shards) drives servers
  through the client, beside ``launch``, which starts the servers a scale-up adds.
- ``checkpoint`` coordinates saves and loads through the client and the worker
  collectives; the ``worker`` (trainer) offers ``save_checkpoint`` on top of it.
- ``models``/``recall`` build on the worker, ``online`` drives jobs, ``serving`` answers
  predictions from the inference saves they write (read through ``checkpoint``), and the
  top floor is the entry points: the public front door (``__init__``), the command line,
  the demo, the bundled jobs, the benchmarks and the test helpers.

``WIRING`` names the few modules that, like a user's script, start from the public front
door (``import sparseps``): they may import any layer.
"""

from __future__ import annotations

__all__ = ["LAYERS", "WIRING"]

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "layers"),
    ("env", "core", "observe"),
    ("optim",),
    ("config",),
    ("table", "metrics", "data"),
    ("files",),
    ("rpc",),
    ("server",),
    ("launch", "elastic"),
    ("role",),
    ("checkpoint",),
    ("worker", "nn"),
    ("models", "recall"),
    ("online", "serving"),
    ("testing", "jobs", "demo", "cli", "benchmarking", "__init__"),
)

WIRING: frozenset[str] = frozenset({"sparseps.online.job"})
