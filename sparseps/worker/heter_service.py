"""The heter worker: the dense half of every training step of its trainers.

A heter worker runs the job's user script like every role; when the script constructs its
:class:`~sparseps.Trainer`, the trainer sees the ``heter_worker`` role and hands itself to
:func:`serve_from_env`, which serves until the launcher stops the job (then the process
exits 0: the rest of the script is a trainer's). So the same script runs with or without
heter workers; the split point is the model's ``SparseEmbedding`` modules.

The ``heter_step`` requests of its trainers (see :mod:`.heter_ops`) are gathered into
device batches (:mod:`.heter_gather`: a window bounded by rows and time; in sync mode one
step of every trainer). Per device batch: each ``SparseEmbedding`` of the model is bound to
the stacked outputs the trainers computed (leaves that require grad), the model runs
forward once, the trainers' loss runs per request on its rows (:mod:`.heter_model`),
backward gives the gradients of the embedding outputs (sent back, each request its rows)
and of the dense parameters, which go to the servers' dense table as one update (one push
in flight, fresh values pulled every ``dense_pull_interval`` updates, overlapped with the
next batch). Utilisation and batch sizes are on ``/metrics`` (:mod:`.heter_metrics`).

Nothing a peer sends stops the loop except ``stop`` (and SIGTERM / SIGINT): a bad message
or a failing step gets an error reply naming it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
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
from .heter_gather import (
    DeviceBatch,
    Step,
    check_sync,
    gather_window,
    group_steps,
    window_full,
)
from .heter_metrics import heter_metrics
from .heter_model import OnHost, RowsOf, remote_batch
from .heter_ops import HETER_OPS
from .heter_wire import check_shapes, join, split
from .modes import DENSE_TABLE
from .nn import SparseEmbedding

if TYPE_CHECKING:
    from ..rpc.client import PSClient
    from ..rpc.handle import Handle

__all__ = ["HeterService", "serve_from_env"]

log = logging.getLogger(__name__)

POLL_MS = 100
_COUNTS = ("steps", "batches", "rows", "busy_s", "idle_s")  # flush reports, logs


class TrainerParts(Protocol):
    """What a heter worker takes from the script's Trainer (not imported: the trainer
    module calls this one)."""

    model: torch.nn.Module
    loss: Any
    strategy: Any
    num_threads: int | None


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
        self.forward = OnHost(self.model)
        self.window = gather_window(self.config)
        self.metrics = heter_metrics()
        self.stop_requested = threading.Event()
        self.steps = self.batches = self.rows = 0  # since the last flush
        self.busy_s = self.idle_s = 0.0
        self.totals = dict.fromkeys(_COUNTS, 0.0)  # since the first request
        self._pulled = False
        self._dense_push: Handle | None = None
        self._dense_pull: Handle | None = None

    # -- one device batch ----------------------------------------------------------

    def check(self, envelope: list, request: Request) -> Step:
        """A ``heter_step`` request checked against the model (ProtocolError if not)."""
        dense, flat = request.bufs["dense"], request.bufs["outputs"]
        shapes = check_shapes(request.args["shapes"], int(dense.shape[0]), self.dims, flat.size)
        scale = float(request.args["scale"])
        if not scale > 0:
            raise ProtocolError(f"heter_step: 'scale' must be > 0, got {scale!r}")
        return Step(envelope, request, shapes, check_sync(request.args.get("sync")))

    def step(self, request: Request) -> tuple[dict, list[np.ndarray]]:
        """The dense half of one step: ``(result, [grads, predictions, labels])``."""
        return self.run([self.check([], request)])[0]

    def run(self, steps: list[Step]) -> list[tuple[dict, list[np.ndarray]]]:
        """The dense half of ``steps`` (one key, :func:`~.heter_gather.group_steps`) as one
        device batch: per step ``(result, [grads, predictions, labels])``, what the step
        alone would give (:mod:`.heter_gather`); one dense update for them all."""
        started = time.perf_counter()
        batch = DeviceBatch(steps, split)
        sync = steps[0].sync is not None
        if sync:  # the step before may have run on another heter worker: fresh values
            self._pulled, self._dense_pull = False, None
        self._install_dense()
        outputs = [
            torch.tensor(part, device=self.device, requires_grad=True) for part in batch.outputs
        ]
        for module, output in zip(self.embeddings, outputs, strict=True):
            module.bind_output(output)
        try:
            self.dense.zero_grad()
            stacked = self.forward(remote_batch(batch.dense, batch.labels))
            losses, scaled = [], []
            for step, (start, stop) in zip(batch.steps, batch.bounds, strict=True):
                rows = RowsOf(self.forward, stacked, start, stop)
                out = self.loss(
                    rows, remote_batch(batch.dense[start:stop], batch.labels[start:stop])
                )
                scaled.append(out.loss / float(step.request.args["scale"]))
                losses.append(out)
            torch.stack(scaled).sum().backward()
        finally:
            for module in self.embeddings:
                module.unbind()
        self._push_dense(self.dense.grads())
        if sync and self._dense_push is not None:  # applied before the trainers go on
            self._dense_push.wait()
            self._dense_push = self._dense_pull = None
        self.steps += len(batch)
        self.batches += 1
        self.rows += batch.rows
        grads = [o.grad if o.grad is not None else torch.zeros_like(o) for o in outputs]
        timing = {"device_s": time.perf_counter() - started, "batch_rows": batch.rows}
        replies = []
        for (start, stop), out in zip(batch.bounds, losses, strict=True):
            flat, _ = join([g[start:stop] for g in grads])
            predictions = np.ascontiguousarray(out.predictions, np.float32)
            result_labels = np.ascontiguousarray(out.labels, np.float32)
            replies.append(
                ({"loss": float(out.loss.detach()), **timing}, [flat, predictions, result_labels])
            )
        return replies

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
        pull = self.batches % self.config.dense_pull_interval == 0
        grad = np.ascontiguousarray(grad)
        self._dense_push = self.client.push_dense(DENSE_TABLE, grad, pull=pull)
        if pull:  # the values after this step come back with it (one round trip)
            self._dense_pull = self._dense_push

    def flush(self) -> dict:
        """Every dense update sent so far is applied; busy/idle seconds since the last."""
        if self._dense_push is not None:
            self._dense_push.wait()
            self._dense_push = None
        report = {key: round(getattr(self, key), 4) for key in _COUNTS}
        self._add_to_totals()
        return report

    def _add_to_totals(self) -> None:
        for key in _COUNTS:
            self.totals[key] += getattr(self, key)
        self.steps = self.batches = self.rows = 0
        self.busy_s = self.idle_s = 0.0

    # -- the loop ------------------------------------------------------------------

    def decode(self, frames: list) -> Request | list:
        """The request of ``frames``, or the error reply frames of a bad message."""
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
        return request

    def answer(self, frames: list) -> list:
        """One request in, reply frames out; never raises."""
        request = self.decode(frames)
        if isinstance(request, list):
            return request
        return self.answer_request(request)

    def _handle(self, request: Request) -> list:
        if request.op == "heter_step":
            result, bufs = self.step(request)
            return encode_reply(request.id, result=result, bufs=bufs)
        if request.op == "heter_flush":
            return encode_reply(request.id, result=self.flush())
        if request.op == "stop":
            self.stop_requested.set()
        return encode_reply(request.id, result=None)

    def _guarded(self, request: Request, handle) -> list:
        """``handle()``'s reply frames, or an error reply naming what failed."""
        try:
            return handle()
        except SparsePSError as exc:
            log.warning("heter worker %d: %s failed: %s", self.rank, request.op, exc)
            return _error_reply(request.id, exc)
        except Exception as exc:  # a bug or a model error: the peer gets it, we keep serving
            log.exception("heter worker %d: %s failed", self.rank, request.op)
            return _error_reply(request.id, exc)

    def run_replies(self, steps: list[Step]) -> list[list]:
        """Reply frames (envelope first) of ``steps``, one device batch per key; a gathered
        batch that fails runs again step by step, so a bad request fails alone."""
        out: list[list] = []
        for group in group_steps(steps):
            if len(group) > 1:
                try:
                    done = self.run(group)
                except Exception as exc:
                    log.warning(
                        "heter worker %d: a device batch of %d steps failed (%s); each runs alone",
                        self.rank, len(group), exc,
                    )  # fmt: skip
                else:
                    out += [[*s.envelope, *_reply(s, r)] for s, r in zip(group, done, strict=True)]
                    continue
            for step in group:
                reply = self._guarded(step.request, lambda s=step: _reply(s, self.run([s])[0]))
                out.append([*step.envelope, *reply])
        return out

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
        batches = max(self.totals["batches"], 1)
        log.info(
            "heter worker %d: stopped after %d steps in %d device batches (mean %.1f rows, "
            "%.2f steps); busy %.2f s, idle %.2f s (waiting on its trainers %.1f%% of the time "
            "since the first request)",
            self.rank, self.totals["steps"], self.totals["batches"],
            self.totals["rows"] / batches, self.totals["steps"] / batches,
            busy, idle, 100 * idle / max(busy + idle, 1e-9),
        )  # fmt: skip

    def _loop(self, sock: zmq.Socket) -> None:
        waited: float | None = None  # idle time counts from the first request on
        while not self.stop_requested.is_set():
            if not sock.poll(POLL_MS):
                continue
            start = time.perf_counter()
            idle = 0.0 if waited is None else start - waited
            steps, other = self._gather(sock)
            for frames in self.run_replies(steps):
                transport.send_frames(sock, frames)
            if other is not None:  # after the steps before it (a flush must see them)
                envelope, request = other
                reply = request if isinstance(request, list) else self.answer_request(request)
                transport.send_frames(sock, [*envelope, *reply])
            waited = time.perf_counter()
            self.idle_s += idle
            self.busy_s += waited - start
            if steps:
                self.metrics.batch_done(
                    len(steps), sum(s.rows for s in steps), waited - start, idle
                )

    def answer_request(self, request: Request) -> list:
        return self._guarded(request, lambda: self._handle(request))

    def _gather(self, sock: zmq.Socket) -> tuple[list[Step], tuple | None]:
        """The steps of one window (:mod:`.heter_gather`), and the message that closed it
        early when it was not a step (``(envelope, request or error reply)``). Bad steps are
        answered here."""
        steps: list[Step] = []
        rows, deadline = 0, None
        while True:
            frames = transport.recv_frames(sock)
            envelope, request = frames[:1], self.decode(frames[1:])
            if isinstance(request, list) or request.op != "heter_step":
                return steps, (envelope, request)
            try:
                step = self.check(envelope, request)
            except ProtocolError as exc:
                log.warning("heter worker %d: bad heter_step refused: %s", self.rank, exc)
                transport.send_frames(sock, [*envelope, *_error_reply(request.id, exc)])
            else:
                first = steps[0].sync if steps else None
                if step.sync is not None and first is not None and first[0] != step.sync[0]:
                    self._supersede(sock, steps, step)
                    steps, rows = [], 0
                steps.append(step)
                rows += step.rows
            if window_full(steps, rows, self.window):
                return steps, None
            if steps and steps[0].sync is not None:  # the rest of the step's trainers
                while not sock.poll(POLL_MS):
                    if self.stop_requested.is_set():
                        return steps, None
                continue
            now = time.perf_counter()
            deadline = now + self.window.wait_s if deadline is None else deadline
            if not sock.poll(int(max(0.0, deadline - now) * 1000)):
                return steps, None

    def _supersede(self, sock: zmq.Socket, steps: list[Step], newer: Step) -> None:
        """A sync step's window left incomplete (its trainers restarted): its requests get
        an error, the newer step's window starts."""
        old_step = steps[0].sync[0] if steps[0].sync is not None else None
        new_step = newer.sync[0] if newer.sync is not None else None
        exc = ProtocolError(
            f"heter_step: sync step {old_step} superseded by step {new_step} "
            f"before all of its trainers arrived (the trainers restarted?)"
        )
        log.warning("heter worker %d: %s", self.rank, exc)
        for old in steps:
            transport.send_frames(sock, [*old.envelope, *_error_reply(old.request.id, exc)])

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def _stop(signum, _frame):
            log.info("heter worker %d: signal %d, stopping", self.rank, signum)
            self.stop_requested.set()

        return {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}


def _reply(step: Step, done: tuple[dict, list[np.ndarray]]) -> list:
    result, bufs = done
    return encode_reply(step.request.id, result=result, bufs=bufs)


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
