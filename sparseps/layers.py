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
- ``rpc`` is the wire and the client; ``server`` uses its protocol; ``store`` (the job's
  key-value store, over ``rpc``'s security) is where launchers and workers meet;
  ``launch`` starts processes and talks to servers through the client; ``runtime`` (the
  workers' rendezvous and process group, local mode's server, started through
  ``launch``'s fork servers) is what ``role`` wires a process into a job with
  (``run_server`` runs ``server``).
- ``elastic`` (an elastic job's client side, its migration driver and the driver's
  connections; docs/elastic.md) sits right above ``rpc``: its placement router routes a
  client by the servers' placement and its driver moves shards through the client, so it
  imports ``rpc``. The client in turn must follow a job that turns elastic, and cannot
  import ``elastic`` (that would be a circle): it takes its placement router by injection
  (``PSClient(placement_routing=...)``, the contract in ``rpc.router``), so the plain
  client never imports nor runs elastic code. It sits below ``server``, whose op table
  maps the move ops to the server side of elasticity (``elastic/server_moves.py``), and
  below ``launch``, which
  starts the servers a scale-up adds and drives ``sparseps scale`` with it.
- ``checkpoint`` coordinates saves and loads through the client and the worker
  collectives; the ``worker`` (trainer) offers ``save_checkpoint`` on top of it.
- ``models``/``recall`` build on the worker, ``online`` drives jobs, ``serving`` answers
  predictions from the inference saves they write (read through ``checkpoint``), and the
  top floor is the entry points: the public front door (``__init__``), the command line,
  the demo, the bundled jobs, the benchmarks and the test helpers.

``WIRING`` names the few modules that may import any layer: those that, like a user's
script, start from the public front door (``import sparseps``), and ``rpc.following``,
the default of the injection above: a client made without a placement router (a
trainer's, made in ``worker/state.py``, which does not know whether its job will be
scaled) gets ``elastic``'s from it, imported when the client is made. It goes once the
code that makes clients passes the router itself (issue 53).
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
    ("elastic", "store"),
    ("server",),
    ("launch",),
    ("runtime",),
    ("role",),
    ("checkpoint",),
    ("worker", "nn"),
    ("models", "recall"),
    ("online", "serving"),
    ("testing", "jobs", "demo", "cli", "benchmarking", "__init__"),
)

WIRING: frozenset[str] = frozenset({"sparseps.online.job", "sparseps.rpc.following"})
