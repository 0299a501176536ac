"""Request gathering in a heter worker (item 1 of issue 57): the requests of several
trainers run as one device batch, each answered with what its own step would get, the
dense parameters updated once with the sum of their gradients; a bad request in a window
fails alone; the utilisation is on /metrics."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import sparseps as sps
from sparseps.data import CRITEO, QueueDataset
from sparseps.data.synthetic import write_dataset
from sparseps.errors import RemoteError
from sparseps.models import WideDeep
from sparseps.observe.registry import registry, serve_metrics, stop_serving_metrics
from sparseps.observe.status import StatusServer, parse_exposition
from sparseps.rpc.channel import Channel
from sparseps.rpc.protocol import Limits
from sparseps.rpc.transport import free_port
from sparseps.testing import local_cluster
from sparseps.worker.binding import TableBinder
from sparseps.worker.dense_params import DenseParams
from sparseps.worker.heter_gather import GatherWindow
from sparseps.worker.heter_ops import HETER_OPS
from sparseps.worker.heter_service import HeterService
from sparseps.worker.heter_wire import join
from sparseps.worker.modes import DENSE_TABLE

TRAINERS = 4
BATCH = 32


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gather-data")
    write_dataset(folder, rows=TRAINERS * BATCH * 2, seed=4, files=1, test_rows=10)
    reader = QueueDataset([str(folder / "train")], CRITEO, batch_size=BATCH, rank=0, world=1)
    return list(reader)[:TRAINERS]


def _model() -> WideDeep:
    torch.manual_seed(7)
    return WideDeep(CRITEO.slots, len(CRITEO.dense), emb_dim=4, hidden=(16, 8))


def _request(model, batch, seed: int):
    """A trainer's heter_step buffers and args for ``batch`` (random pulled rows)."""
    rng = np.random.default_rng(seed)
    binder = TableBinder([m for m in model.modules() if isinstance(m, sps.nn.SparseEmbedding)])
    lookups = binder.lookups(batch)
    rows = {
        t: rng.normal(0, 0.1, (lk.keys.size, binder.tables[t].dim)).astype(np.float32)
        for t, lk in lookups.items()
    }
    binder.bind(batch, lookups, rows, grad=True)
    outputs = [emb(batch) for emb in binder.embeddings]
    binder.unbind()
    flat, shapes = join(outputs)
    labels = np.asarray(batch.label, np.float32).reshape(-1, 1)
    return [np.ascontiguousarray(batch.dense, np.float32), labels, flat], shapes


class Serving:
    """A heter service in a thread with its dense pushes recorded, and one channel per
    trainer."""

    def __init__(self, client, mode: sps.Heter) -> None:
        model = _model()
        trainer = sps.Trainer(model, client=client, strategy=sps.Strategy(mode=mode))
        endpoint = f"127.0.0.1:{free_port()}"
        self.service = HeterService(trainer, client, rank=0, endpoint=endpoint, job_id="job-g")
        self.pushed: list[np.ndarray] = []
        push = self.service._push_dense
        self.service._push_dense = lambda grad: (self.pushed.append(grad.copy()), push(grad))[1]
        self.thread = threading.Thread(target=self.service.serve, daemon=True)
        self.thread.start()
        self.channels = [
            Channel(
                [endpoint],
                timeout=30,
                timeout_setting="test",
                max_in_flight=4,
                limits=Limits(),
                job_id="job-g",
                role="heter_worker",
                ops=HETER_OPS,
            )  # fmt: skip
            for _ in range(TRAINERS)
        ]

    def steps(self, requests: list[tuple[list, dict]]) -> list:
        """Send every request (trainer i sends request i), then wait for all."""
        calls = [
            (ch, ch.submit(0, "heter_step", None, bufs, args))
            for ch, (bufs, args) in zip(self.channels, requests, strict=True)
        ]
        out = []
        for ch, call in calls:
            try:
                out.append(ch.wait(call, time.monotonic() + 30, 30))
            except RemoteError as exc:
                out.append(exc)
        return out

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.service.stop_requested.set()
        self.thread.join(10)


@pytest.fixture
def cluster_client():
    with (
        local_cluster(servers=1, timeout=30, job_id="job-g") as cluster,
        cluster.client() as client,
    ):
        dense = DenseParams(_model())
        client.create_dense(DENSE_TABLE, dense.size, sps.optim.SGD(lr=1e-12), init=dense.values())
        yield client


def _requests(batches, scales):
    model = _model()
    out = []
    for i, (batch, scale) in enumerate(zip(batches, scales, strict=True)):
        bufs, shapes = _request(model, batch, seed=i)
        out.append((bufs, {"shapes": shapes, "scale": float(scale)}))
    return out


def test_gathered_requests_get_what_each_step_alone_gets(cluster_client, batches):
    # different scales in one window: each request's own loss scale still applies
    requests = _requests(batches, scales=(BATCH, BATCH, 2 * BATCH, 3 * BATCH))
    alone = Serving(cluster_client, sps.Heter(gather_rows=0))
    try:
        want = []
        for request in requests:  # one at a time: four device batches, four dense updates
            call = alone.channels[0].submit(0, "heter_step", None, *request)
            want.append(alone.channels[0].wait(call, time.monotonic() + 30, 30))
        assert len(alone.pushed) == TRAINERS
    finally:
        alone.close()
    # the window closes on rows: all four requests, one device batch, one dense update
    gathered = Serving(cluster_client, sps.Heter(gather_rows=TRAINERS * BATCH, gather_ms=20_000))
    try:
        got = gathered.steps(requests)
        assert len(gathered.pushed) == 1
        np.testing.assert_allclose(gathered.pushed[0], np.sum(alone.pushed, axis=0), atol=1e-6)
        assert np.abs(gathered.pushed[0]).max() > 1e-4
        for g, w in zip(got, want, strict=True):
            for g_buf, w_buf in zip(g.bufs, w.bufs, strict=True):
                np.testing.assert_allclose(g_buf, w_buf, atol=1e-6, rtol=1e-5)
            assert g.result["loss"] == pytest.approx(w.result["loss"], rel=1e-5)
        flushed = gathered.channels[0].wait(
            gathered.channels[0].submit(0, "heter_flush", None, [], None),
            time.monotonic() + 30, 30,
        )  # fmt: skip
        assert flushed.result["steps"] == TRAINERS and flushed.result["batches"] == 1
        assert flushed.result["rows"] == TRAINERS * BATCH
    finally:
        gathered.close()
    metrics = parse_exposition(_exposition())
    assert metrics["sparseps_heter_requests_total"][0][1] >= 2 * TRAINERS
    assert 0 < metrics["sparseps_heter_utilisation"][0][1] <= 1
    # the status page reads them from the heter worker's /metrics
    port = serve_metrics(free_port())
    try:
        role = {"role": "heter_worker", "rank": 0, "alive": True, "metrics_port": port}
        with StatusServer(lambda: [role], job_id="job-g") as page:
            page.sample()
            shown = page.status()["heter_workers"]["0"]
    finally:
        stop_serving_metrics()
    assert 0 < shown["utilisation"] <= 1 and shown["mean_batch_rows"] > BATCH


def test_a_bad_request_in_a_window_fails_alone(cluster_client, batches):
    requests = _requests(batches, scales=(BATCH,) * TRAINERS)
    bufs, args = requests[2]
    wide = np.ones((BATCH, bufs[0].shape[1] + 1), np.float32)  # a dense feature too many
    requests[2] = ([wide, *bufs[1:]], args)
    serving = Serving(cluster_client, sps.Heter(gather_rows=TRAINERS * BATCH, gather_ms=20_000))
    try:
        got = serving.steps(requests)
        assert isinstance(got[2], RemoteError) and "RuntimeError" in str(got[2])
        assert all(not isinstance(g, Exception) and g.bufs[1].shape == (BATCH, 1)
                   for i, g in enumerate(got) if i != 2)  # fmt: skip
    finally:
        serving.close()


def test_the_window_closes_on_time_with_fewer_rows(cluster_client, batches):
    requests = _requests(batches[:1], scales=(BATCH,))
    serving = Serving(cluster_client, sps.Heter(gather_rows=10_000, gather_ms=50))
    try:
        call = serving.channels[0].submit(0, "heter_step", None, *requests[0])
        reply = serving.channels[0].wait(call, time.monotonic() + 30, 30)
        assert reply.bufs[1].shape == (BATCH, 1) and len(serving.pushed) == 1
    finally:
        serving.close()


def test_the_window_is_checked():
    with pytest.raises(sps.ConfigError, match="Heter.gather_rows"):
        sps.Heter(gather_rows=-1)
    with pytest.raises(sps.ConfigError, match="Heter.gather_ms"):
        sps.Heter(gather_ms=float("nan"))
    with pytest.raises(sps.ConfigError, match="GatherWindow.wait_s"):
        GatherWindow(wait_s=-1.0)
    assert not GatherWindow(rows=0).on and GatherWindow().on


def _exposition() -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry()).decode()
