"""The bottom floor: rules every other package shares, each written once.

- :mod:`.hashing`: the 64-bit mixer (splitmix64's finaliser), compiled and vectorised,
  and the seeded hash of in-memory structures;
- :mod:`.routing`: which server owns a key (the shard function, grouping a batch of keys
  by server, the misrouting check) and which server holds a dense table;
- :mod:`.validate`: argument checks with one name per meaning (config fields, key arrays);
- :mod:`.deadline`: how a worker-to-worker collective's wait turns into a named timeout.
- :mod:`.lazy`: a package's public names imported on first use (PEP 562).
- :mod:`.worker_store`: the workers' rendezvous store as :func:`sparseps.init` registered
  it (work-stealing datasets claim files on it).
- :mod:`.closing`: the ``with obj:`` mixin of objects that end with ``close()``.

Modules here import only the standard library, numpy, numba, xxhash and
:mod:`sparseps.errors`; the layer order is declared in :mod:`sparseps.layers`.
"""
