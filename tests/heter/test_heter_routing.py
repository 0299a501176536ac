"""Routing by measured throughput and per-heter-worker devices (issue 57, item 4): a
trainer sends its steps where its measurements say they are answered first, so a faster
heter worker takes more of them; ``--heter-device cuda,cpu`` gives each heter worker its
own device."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from test_heter_gather import BATCH, _model, _requests, batches, cluster_client  # noqa: F401

import sparseps as sps
from sparseps.env import HETER_DEVICE, Role
from sparseps.errors import ConfigError
from sparseps.launch.heter_devices import device_of, heter_device_env, parse_heter_devices
from sparseps.rpc.channel import Channel
from sparseps.rpc.protocol import Limits
from sparseps.rpc.transport import free_port
from sparseps.worker.heter_ops import HETER_OPS
from sparseps.worker.heter_routing import HeterRouter
from sparseps.worker.heter_service import HeterService


def test_the_router_sends_each_step_where_it_is_answered_first():
    router = HeterRouter(2, home=1)
    assert router.pick(100) == 1  # its own heter worker first, then the other one
    assert router.pick(100) == 0
    router.done(1, 100, 200 * 5e-4, 200)  # heter worker 0 answers 5x faster per row
    router.done(0, 100, 100 * 1e-4, 100)
    assert router.seconds_per_row == [1e-4, 5e-4]
    # (rows in flight + rows) x seconds per row: the fast one until its queue is 4 steps
    picks = [router.pick(100) for _ in range(5)]
    assert picks == [0, 0, 0, 0, 1], picks
    assert router.in_flight == [400, 100]
    router.done(0, 100, 100 * 3e-4, 100)  # measured slower now: the average moves
    assert router.seconds_per_row[0] == pytest.approx(0.8 * 1e-4 + 0.2 * 3e-4)
    # a heter worker lost counts as slow until it answers again
    router.lost(0, 300)
    assert router.in_flight[0] == 0 and router.pick(100) == 1


def test_heter_devices_parse_and_go_to_their_heter_worker():
    assert parse_heter_devices("cuda") == ("cuda",)
    assert parse_heter_devices("cuda, cpu") == ("cuda", "cpu")
    with pytest.raises(ConfigError, match="one of .* or a comma list"):
        parse_heter_devices("tpu,cpu")
    assert device_of(("cuda",), 2, 3) == "cuda"
    assert [device_of(("cuda", "cpu"), r, 2) for r in (0, 1)] == ["cuda", "cpu"]
    with pytest.raises(ConfigError, match="2 devices .* for 3 heter workers"):
        device_of(("cuda", "cpu"), 0, 3)
    job = {HETER_DEVICE: "cuda,cpu", "OTHER": "1"}
    assert heter_device_env(job, Role.HETER_WORKER, 1, 2) == {HETER_DEVICE: "cpu", "OTHER": "1"}
    assert heter_device_env(job, Role.WORKER, 0, 2) == {"OTHER": "1"}


class _Slow(torch.nn.Module):
    """The model, ``delay`` seconds slower a forward: a slower device."""

    def __init__(self, model: torch.nn.Module, delay: float) -> None:
        super().__init__()
        self.inner, self.delay = model, delay

    def forward(self, batch):
        time.sleep(self.delay)
        return self.inner(batch)


def test_real_heter_workers_of_two_speeds_get_steps_by_throughput(cluster_client, batches):  # noqa: F811
    services, threads, endpoints = [], [], []
    for delay in (0.0, 0.08):  # heter worker 1 is the slow one
        model = _model() if not delay else _Slow(_model(), delay)
        trainer = sps.Trainer(model, client=cluster_client,
                              strategy=sps.Strategy(mode=sps.Heter(gather_rows=0)))  # fmt: skip
        endpoint = f"127.0.0.1:{free_port()}"
        service = HeterService(trainer, cluster_client, rank=len(services), endpoint=endpoint,
                               job_id="job-g")  # fmt: skip
        thread = threading.Thread(target=service.serve, daemon=True)
        thread.start()
        services.append(service)
        threads.append(thread)
        endpoints.append(endpoint)
    channel = Channel(endpoints, timeout=30, timeout_setting="test", max_in_flight=8,
                      limits=Limits(), job_id="job-g", role="heter_worker", ops=HETER_OPS)  # fmt: skip
    router = HeterRouter(2, home=1)
    request = _requests(batches[:1], scales=(BATCH,))[0]
    try:
        in_flight: list = []
        for _ in range(40):
            h = router.pick(BATCH)
            in_flight.append(
                (h, time.perf_counter(), channel.submit(h, "heter_step", None, *request))
            )
            if len(in_flight) >= 2:
                h, _, call = in_flight.pop(0)
                reply = channel.wait(call, time.monotonic() + 30, 30)
                router.done(h, BATCH, reply.result["device_s"], reply.result["batch_rows"])
        for _, _, call in in_flight:
            channel.wait(call, time.monotonic() + 30, 30)
    finally:
        channel.close()
        for service, thread in zip(services, threads, strict=True):
            service.stop_requested.set()
            thread.join(10)
    print(f"\nsteps per heter worker (fast, slow): {router.steps}; seconds per row "
          f"{np.round(router.seconds_per_row, 6).tolist()}")  # fmt: skip
    assert router.steps[0] > 3 * router.steps[1] >= 3, router.steps
