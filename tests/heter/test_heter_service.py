"""The heter worker's service in-process, against a real server (its dense table) and a
real zmq client: a remote step gives the gradients a local step gives, and bad messages
get named error replies while the service keeps serving."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.data.synthetic import write_dataset
from sparseps.errors import ProtocolError, RemoteError
from sparseps.models import WideDeep
from sparseps.rpc.channel import Channel
from sparseps.rpc.protocol import Limits
from sparseps.rpc.transport import free_port
from sparseps.testing import local_cluster
from sparseps.worker.binding import TableBinder
from sparseps.worker.dense_params import DenseParams
from sparseps.worker.heter_ops import HETER_OPS
from sparseps.worker.heter_service import HeterService
from sparseps.worker.heter_wire import join, split
from sparseps.worker.modes import DENSE_TABLE


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("heter-data")
    write_dataset(folder, rows=400, seed=3, files=1, test_rows=10)
    return next(iter(QueueDataset([str(folder / "train")], CRITEO, batch_size=64, rank=0, world=1)))


def _model() -> WideDeep:
    torch.manual_seed(5)
    return WideDeep(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(16, 8))


# the CUDA path runs where a GPU is visible (CI has none)
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def service(device):
    """A HeterService on a free port in a thread (its network on ``device``), with the
    dense table on a real server; yields (service, a Channel to it, the pushed dense
    gradients)."""
    model = _model()
    with (
        local_cluster(servers=1, timeout=30, job_id="job-a") as cluster,
        cluster.client() as client,
    ):
        dense = DenseParams(model)
        client.create_dense(DENSE_TABLE, dense.size, sps.optim.SGD(lr=1e-12), init=dense.values())
        trainer = sps.Trainer(model, client=client)
        endpoint = f"127.0.0.1:{free_port()}"
        svc = HeterService(
            trainer, client, rank=0, endpoint=endpoint, job_id="job-a", device=device
        )
        pushed: list[np.ndarray] = []
        push = svc._push_dense
        svc._push_dense = lambda grad: (pushed.append(grad.copy()), push(grad))[1]
        thread = threading.Thread(target=svc.serve, daemon=True)
        thread.start()
        channel = Channel(
            [endpoint], timeout=20, timeout_setting="test", max_in_flight=8, limits=Limits(),
            job_id="job-a", role="heter_worker", ops=HETER_OPS,
        )  # fmt: skip
        try:
            yield svc, channel, pushed
        finally:
            channel.close()
            svc.stop_requested.set()
            thread.join(10)


def _call(channel: Channel, op: str, bufs=(), args=None):
    call = channel.submit(0, op, None, bufs, args)
    return channel.wait(call, __import__("time").monotonic() + 20, 20)


def _trainer_side(model, batch, rng):
    binder = TableBinder([m for m in model.modules() if isinstance(m, sps.nn.SparseEmbedding)])
    lookups = binder.lookups(batch)
    rows = {
        t: rng.normal(0, 0.1, (lk.keys.size, binder.tables[t].dim)).astype(np.float32)
        for t, lk in lookups.items()
    }
    leaves = binder.bind(batch, lookups, rows, grad=True)
    return binder, lookups, rows, leaves


def _step_bufs(batch, outputs):
    flat, shapes = join(outputs)
    labels = np.asarray(batch.label, np.float32).reshape(-1, 1)
    return [np.ascontiguousarray(batch.dense, np.float32), labels, flat], shapes


def test_a_remote_step_gives_the_gradients_of_a_local_step(service, batch):
    svc, channel, pushed = service
    rng = np.random.default_rng(0)
    # the reference: the whole model here, the trainer's loss, backward
    reference = _model()
    binder, lookups, rows, leaves = _trainer_side(reference, batch, rng)
    out = sps.Trainer(reference).loss(reference, batch)
    (out.loss / len(batch)).backward()
    want_rows = {t: leaf.grad.numpy().copy() for t, leaf in leaves.items()}
    want_dense = DenseParams(reference).grads().copy()
    # the split: embeddings here, the dense network on the heter worker
    model = _model()
    binder, lookups, _, leaves = _trainer_side(model, batch, np.random.default_rng(0))
    outputs = [emb(batch) for emb in binder.embeddings]
    binder.unbind()
    bufs, shapes = _step_bufs(batch, outputs)
    reply = _call(channel, "heter_step", bufs, {"shapes": shapes, "scale": float(len(batch))})
    grads, predictions, labels = reply.bufs
    torch.autograd.backward(outputs, [torch.from_numpy(np.array(g)) for g in split(grads, shapes)])
    for table, leaf in leaves.items():
        np.testing.assert_allclose(leaf.grad.numpy(), want_rows[table], atol=1e-6, rtol=1e-5)
        assert np.abs(want_rows[table]).max() > 1e-4  # the gradients are not all zero
    assert len(pushed) == 1
    np.testing.assert_allclose(pushed[0], want_dense, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(predictions, out.predictions, atol=1e-6)
    np.testing.assert_array_equal(labels, out.labels)
    assert reply.result["loss"] == pytest.approx(float(out.loss.detach()), rel=1e-5)
    flushed = _call(channel, "heter_flush").result
    assert flushed["steps"] == 1 and flushed["busy_s"] > 0


def test_bad_messages_get_named_errors_and_the_service_keeps_serving(service, batch):
    svc, channel, _ = service
    model = copy.deepcopy(svc.model)
    binder, _, _, _ = _trainer_side(model, batch, np.random.default_rng(1))
    outputs = [emb(batch) for emb in binder.embeddings]
    bufs, shapes = _step_bufs(batch, outputs)
    args = {"shapes": shapes, "scale": 64.0}
    wrong_dim = [shapes[0][:2] + [shapes[0][2] + 1], shapes[1]]
    cases = [
        ("heter_step", bufs, {**args, "shapes": wrong_dim}, "expected [64, 26, 4]"),
        ("heter_step", bufs, {**args, "shapes": shapes[:1]}, "one shape per SparseEmbedding"),
        ("heter_step", bufs[:2] + [bufs[2][:-1].copy()], args, "'outputs' has"),
        ("heter_step", [bufs[0].astype(np.int32)] + bufs[1:], args, "must be float32"),
        ("heter_step", bufs, {**args, "scale": 0.0}, "'scale' must be > 0"),
        ("heter_step", bufs, {"shapes": shapes}, "missing argument 'scale'"),
        ("pull", [], None, "unknown op 'pull'"),
    ]
    for op, case_bufs, case_args, message in cases:
        with pytest.raises(ProtocolError, match="heter_worker 0 at .* rejected") as info:
            _call(channel, op, case_bufs, case_args)
        assert message in str(info.value), (message, str(info.value))
    # another job's request is refused
    other = Channel(
        channel.endpoints, timeout=20, timeout_setting="test", max_in_flight=2, limits=Limits(),
        job_id="job-b", role="heter_worker", ops=HETER_OPS,
    )  # fmt: skip
    try:
        with pytest.raises(ProtocolError, match="belongs to job job-a"):
            _call(other, "heter_step", bufs, args)
    finally:
        other.close()
    # still serving
    reply = _call(channel, "heter_step", bufs, args)
    assert reply.bufs[1].shape == (64, 1)
    assert set(HETER_OPS) == {"ping", "stop", "heter_step", "heter_flush"}


def test_a_model_error_is_a_remote_error_not_a_dead_service(service, batch):
    svc, channel, _ = service
    model = copy.deepcopy(svc.model)
    binder, _, _, _ = _trainer_side(model, batch, np.random.default_rng(2))
    outputs = [emb(batch) for emb in binder.embeddings]
    bufs, shapes = _step_bufs(batch, outputs)
    bufs[0] = np.ones((64, bufs[0].shape[1] + 1), np.float32)  # a dense feature too many
    with pytest.raises(RemoteError, match="heter_worker 0 at .* raised RuntimeError"):
        _call(channel, "heter_step", bufs, {"shapes": shapes, "scale": 64.0})
    assert _call(channel, "ping").ok
