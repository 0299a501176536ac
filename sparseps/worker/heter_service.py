"""The heter worker: the dense half of every training step of its trainers.

A heter worker runs the job's user script like every role; when the script constructs its
:class:`~sparseps.Trainer`, the trainer sees the ``heter_worker`` role and hands itself to
:func:`serve_from_env`, which serves until the launcher stops the job (then the process
exits 0: the rest of the script is a trainer's). So the same script runs with or without
heter workers; the split point is the model's ``SparseEmbedding`` modules.

Per ``heter_step`` request (see :mod:`.heter_ops`): each ``SparseEmbedding`` of the model is
bound to the output the trainer computed (a leaf that requires grad), the trainer's loss
runs the model forward on the request's dense features and labels, backward gives the
gradients of the embedding outputs (sent back) and of the dense parameters, which go to
the servers' dense table as in async mode (one push in flight, fresh values pulled every
``dense_pull_interval`` steps, overlapped with the next request). Requests are served one
at a time in arrival order, from any number of trainers.

Nothing a peer sends stops the loop except ``stop`` (and SIGTERM / SIGINT): a bad message
or a failing step gets an error reply naming it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import zmq

from ..env import Role, heter_device_setting, parse_endpoint
from ..errors import ConfigError, ProtocolError, SparsePSError, UnavailableError
from ..rpc import transport
from ..rpc.protocol import Limits, Request, decode_request, encode_reply, peek_request_id
from ..rpc.security import Security, security_from_key_dir
from .dense_params import DenseParams
from .gpups import resolve_device
from .heter_ops import HETER_OPS
from .heter_wire import check_shapes, join, split
from .modes import DENSE_TABLE
from .nn import SparseEmbedding

if TYPE_CHECKING:
    from ..rpc.client import PSClient
    from ..rpc.handle import Handle

__all__ = ["HeterService", "RemoteBatch", "serve_from_env"]

log = logging.getLogger(__name__)

POLL_MS = 100


class TrainerParts(Protocol):
    """What a heter worker takes from the script's Trainer (not imported: the trainer
    module calls this one)."""

    model: torch.nn.Module
    loss: Any
    strategy: Any
    num_threads: int | None


@dataclass(frozen=True)
class RemoteBatch:
    """What the model and the loss read of a batch on a heter worker: no slots (their
    embeddings arrive pooled). A model whose ``forward`` reads ``batch.slots`` itself,
    outside its ``SparseEmbedding`` modules, cannot be split."""

    label: np.ndarray
    dense: np.ndarray
    extra_labels: np.ndarray | None
    slots: dict

    def __len__(self) -> int:
        return int(self.label.shape[0])


class _OnHost(torch.nn.Module):
    """The model with its outputs moved to the host, where the loss and labels are."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch):
        out = self.model(batch)
        if isinstance(out, torch.Tensor):
            return out.cpu()
        return type(out)(o.cpu() if isinstance(o, torch.Tensor) else o for o in out)


class HeterService:
    """Serves the dense network of ``trainer``'s model at ``endpoint``.

    Args:
        trainer: the script's trainer (its model, loss, dense rule and strategy).
        client: a ``PSClient`` to the job's servers (the dense table lives there).
        rank: this heter worker's rank.
        endpoint: ``host:port`` to bind.
        job_id: requests of another job are refused.
        security: the job's CURVE keys (None: plain transport).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    """

    def __init__(
        self,
        trainer: TrainerParts,
        client: PSClient,
        *,
        rank: int,
        endpoint: str,
        job_id: str = "",
        security: Security | None = None,
        device: str = "cpu",
        limits: Limits | None = None,
    ) -> None:
        self.rank, self.endpoint, self.job_id = rank, endpoint, job_id
        self.security, self.limits, self.client = security, limits or Limits(), client
        self.device = resolve_device(device, rank, setting="--heter-device", role="heter_worker")
        self.model = trainer.model.to(self.device)
        self.loss = trainer.loss
        # the trainers' mode (Heter(), or the trainer's own when set): its dense pulls
        self.config = trainer.strategy.resolved(heter_workers=True).mode
        self.embeddings = [m for m in self.model.modules() if isinstance(m, SparseEmbedding)]
        if any(m.pooling is None for m in self.embeddings):
            raise ConfigError(
                "heter workers split a model at pooled SparseEmbedding outputs; "
                "pooling=None (unpooled rows) is not supported in heter mode"
            )
        self.dims = [
            (len(m.slots) if m.slots is not None else None, m.output_dim) for m in self.embeddings
        ]
        self.dense = DenseParams(self.model)
        self.forward = _OnHost(self.model)
        self.stop_requested = threading.Event()
        self.steps = 0
        self.busy_s = self.idle_s = 0.0  # since the last flush
        self.totals = {"steps": 0.0, "busy_s": 0.0, "idle_s": 0.0}  # since the first request
        self._pulled = False
        self._dense_push: Handle | None = None
        self._dense_pull: Handle | None = None

    # -- one step ------------------------------------------------------------------

    def step(self, request: Request) -> tuple[dict, list[np.ndarray]]:
        """The dense half of one step: ``(result, [grads, predictions, labels])``."""
        dense, labels, flat = (request.bufs[k] for k in ("dense", "labels", "outputs"))
        batch = int(dense.shape[0])
        shapes = check_shapes(request.args["shapes"], batch, self.dims, flat.size)
        scale = float(request.args["scale"])
        if not scale > 0:
            raise ProtocolError(f"heter_step: 'scale' must be > 0, got {scale!r}")
        self._install_dense()
        outputs = [
            torch.tensor(part, device=self.device, requires_grad=True)
            for part in split(flat, shapes)
        ]
        for module, output in zip(self.embeddings, outputs, strict=True):
            module.bind_output(output)
        try:
            remote = RemoteBatch(
                label=np.array(labels[:, 0]),  # copies: the received frames are read-only
                dense=np.array(dense, np.float32),  # writable: the model may read it in place
                extra_labels=np.array(labels[:, 1:]) if labels.shape[1] > 1 else None,
                slots={},
            )
            self.dense.zero_grad()
            out = self.loss(self.forward, remote)
            (out.loss / scale).backward()
        finally:
            for module in self.embeddings:
                module.unbind()
        grads, _ = join([o.grad if o.grad is not None else torch.zeros_like(o) for o in outputs])
        self._push_dense(self.dense.grads())
        self.steps += 1
        predictions = np.ascontiguousarray(out.predictions, np.float32)
        result_labels = np.ascontiguousarray(out.labels, np.float32)
        return {"loss": float(out.loss.detach())}, [grads, predictions, result_labels]

    def _install_dense(self) -> None:
        if not self.dense.size:
            return
        if not self._pulled:  # the trainers' worker 0 created the table before any step
            self.dense.set(self.client.pull_dense(DENSE_TABLE).wait())
            self._pulled = True
        elif self._dense_pull is not None:
            self.dense.set(self._dense_pull.wait())
        self._dense_pull = None

    def _push_dense(self, grad: np.ndarray) -> None:
        if not grad.size:
            return
        if self._dense_push is not None:  # one in flight: dense updates stay in order
            self._dense_push.wait()
        pull = self.steps % self.config.dense_pull_interval == 0
        grad = np.ascontiguousarray(grad)
        self._dense_push = self.client.push_dense(DENSE_TABLE, grad, pull=pull)
        if pull:  # the values after this step come back with it (one round trip)
            self._dense_pull = self._dense_push

    def flush(self) -> dict:
        """Every dense update sent so far is applied; busy/idle seconds since the last."""
        if self._dense_push is not None:
            self._dense_push.wait()
            self._dense_push = None
        report = {
            "steps": self.steps,
            "busy_s": round(self.busy_s, 4),
            "idle_s": round(self.idle_s, 4),
        }
        self._add_to_totals()
        return report

    def _add_to_totals(self) -> None:
        for key in ("steps", "busy_s", "idle_s"):
            self.totals[key] += getattr(self, key)
        self.steps, self.busy_s, self.idle_s = 0, 0.0, 0.0

    # -- the loop ------------------------------------------------------------------

    def answer(self, frames: list) -> list:
        """One request in, reply frames out; never raises."""
        try:
            request = decode_request(frames, self.limits, HETER_OPS)
            if request.job is not None and self.job_id and request.job != self.job_id:
                raise ProtocolError(
                    f"heter worker {self.rank} belongs to job {self.job_id}, not {request.job}"
                )
        except ProtocolError as exc:
            log.warning(
                "heter worker %d: bad message dropped with an error reply: %s", self.rank, exc
            )
            return _error_reply(peek_request_id(frames), exc)
        try:
            if request.op == "heter_step":
                result, bufs = self.step(request)
                return encode_reply(request.id, result=result, bufs=bufs)
            if request.op == "heter_flush":
                return encode_reply(request.id, result=self.flush())
            if request.op == "stop":
                self.stop_requested.set()
            return encode_reply(request.id, result=None)
        except SparsePSError as exc:
            log.warning("heter worker %d: %s failed: %s", self.rank, request.op, exc)
            return _error_reply(request.id, exc)
        except Exception as exc:  # a bug or a model error: the peer gets it, we keep serving
            log.exception("heter worker %d: %s failed", self.rank, request.op)
            return _error_reply(request.id, exc)

    def serve(self) -> None:
        """Answer requests until ``stop`` (or SIGTERM/SIGINT in the main thread)."""
        context = transport.new_context()
        auth = self.security.authenticator(context) if self.security is not None else None
        sock = transport.new_router(context, self.limits.max_message_bytes, security=self.security)
        previous = self._install_signals()
        try:
            address = transport.bind_address(self.endpoint)
            try:
                sock.bind(address)
            except zmq.ZMQError as exc:
                raise UnavailableError(
                    f"heter worker {self.rank}: cannot bind {address} ({exc})",
                    op="bind", role="heter_worker", rank=self.rank, address=self.endpoint,
                ) from None  # fmt: skip
            host, port = parse_endpoint(self.endpoint)
            log.info(
                "running heter worker %d at %s:%d on %s (%d embedding outputs per step)",
                self.rank, host, port, self.device, len(self.embeddings),
            )  # fmt: skip
            self._loop(sock)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sock.close(linger=1000)
            if auth is not None:
                auth.close()
            context.term()
        self._add_to_totals()
        busy, idle = self.totals["busy_s"], self.totals["idle_s"]
        log.info(
            "heter worker %d: stopped after %d steps; busy %.2f s, idle %.2f s (waiting on "
            "its trainers %.1f%% of the time since the first request)",
            self.rank, self.totals["steps"], busy, idle, 100 * idle / max(busy + idle, 1e-9),
        )  # fmt: skip

    def _loop(self, sock: zmq.Socket) -> None:
        waited: float | None = None  # idle time counts from the first request on
        while not self.stop_requested.is_set():
            if not sock.poll(POLL_MS):
                continue
            frames = transport.recv_frames(sock)
            start = time.perf_counter()
            self.idle_s += 0.0 if waited is None else start - waited
            envelope, body = frames[:1], frames[1:]
            transport.send_frames(sock, [*envelope, *self.answer(body)])
            waited = time.perf_counter()
            self.busy_s += waited - start

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def _stop(signum, _frame):
            log.info("heter worker %d: signal %d, stopping", self.rank, signum)
            self.stop_requested.set()

        return {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}


def _error_reply(request_id, exc: BaseException) -> list:
    return encode_reply(
        request_id, error={"type": type(exc).__name__, "message": str(exc), "traceback": ""}
    )


def serve_from_env(trainer: TrainerParts) -> None:
    """Serve as the heter worker the launcher's environment describes (blocks)."""
    from .. import role
    from ..rpc.client import PSClient

    env = role.role_env()
    if env is None or env.role is not Role.HETER_WORKER:
        raise ConfigError("serve_from_env: this process is not a heter worker (SPARSEPS_ROLE)")
    security = security_from_key_dir(env.key_dir)
    with PSClient(
        list(env.servers), timeout=trainer.strategy.rpc_timeout, job_id=env.job_id,
        security=security,
    ) as client:  # fmt: skip
        if trainer.num_threads:
            torch.set_num_threads(trainer.num_threads)
        HeterService(
            trainer, client, rank=env.rank, endpoint=env.heter_workers[env.rank],
            job_id=env.job_id, security=security, device=heter_device_setting(),
        ).serve()  # fmt: skip
