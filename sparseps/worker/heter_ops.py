"""The heter worker's ops on the wire (checked by :func:`sparseps.rpc.protocol.decode_request`).

The heter worker speaks the servers' protocol (msgpack header + raw buffers, the job id,
CURVE when the job is secure) with its own op table, so a bad message gets the same
named :class:`~sparseps.errors.ProtocolError` reply and never stops it.

- ``heter_step``: one training step's dense half. Buffers: ``dense`` float32 ``[B, D]``
  (the batch's dense features), ``labels`` float32 ``[B, 1 + K]`` (label, then the
  schema's extra labels), ``outputs`` float32 ``[N]`` (every ``SparseEmbedding``'s
  output of the step, flattened and concatenated in module order; ``shapes`` says how
  to cut it). Reply: ``result`` ``{"loss": summed loss, "device_s": seconds of the device
  batch the step ran in, "batch_rows": its rows}`` (the heter worker's throughput, which
  trainers route by), buffers ``grads`` (the same
  layout as ``outputs``), ``predictions`` and ``labels`` float32 ``[B, T]``. Heter in sync
  mode adds ``sync``: ``[step, trainers, trainer]`` (the step's number, how many trainers
  contribute to it, the sender's rank): the heter worker runs the step once all of them
  arrived, in trainer order, and answers once its dense update is applied.
- ``heter_flush``: every dense update this heter worker sent is applied on the servers;
  ``result``: its busy and idle seconds and steps since the last flush.
- ``ping``, ``stop``: liveness; stop (the launcher's, at the end of the job).
"""

from __future__ import annotations

from ..rpc.ops import BufSpec, OpSchema

__all__ = ["HETER_OPS"]

_NONE = type(None)

HETER_OPS: dict[str, OpSchema] = {
    "ping": OpSchema(),
    "stop": OpSchema(),
    "heter_step": OpSchema(
        bufs=(
            BufSpec("dense", "float32", 2),
            BufSpec("labels", "float32", 2),
            BufSpec("outputs", "float32", 1),
        ),
        same_rows=("dense", "labels"),
        args={
            "shapes": ((list,), True),
            "scale": ((float, int), True),
            "sync": ((list,), False),
        },
        answer={"loss": (float, int), "device_s": (float, int), "batch_rows": (int,)},
        answer_bufs=(
            BufSpec("grads", "float32", 1),
            BufSpec("predictions", "float32", 2),
            BufSpec("labels", "float32", 2),
        ),
    ),
    "heter_flush": OpSchema(answer={"busy_s": (float, int), "idle_s": (float, int)}),
}
