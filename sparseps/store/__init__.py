"""The job's key-value store: a small store over ZeroMQ (CURVE-secured in a ``--secure``
job) where launchers and workers meet: its client (:mod:`.client`), its server
(:mod:`.server`), the client as a ``torch.distributed.Store`` (:mod:`.torch_store`, gloo's
rendezvous runs on it) and the keys the launcher and an online job's workers share
(:mod:`.worker_keys`). The launcher (:mod:`sparseps.launch`) hosts one to coordinate its
nodes; worker 0 hosts the workers' (:mod:`sparseps.runtime.rendezvous`).
"""
