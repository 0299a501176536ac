"""A worker's place in a running job, below :mod:`sparseps.role`: the rendezvous at worker
0's store and the barriers on it (:mod:`.rendezvous`), the workers' ``torch.distributed``
group (gloo, or over CURVE in a ``--secure`` job: :mod:`.curve_group`, :mod:`.curve_ops`)
and local mode's background server (:mod:`.local`).
"""
