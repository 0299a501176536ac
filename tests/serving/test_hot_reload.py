"""Hot reload under load: a client sends requests without pause while ten deltas, then a
new base and a delta on it, land in the served folder; zero failed requests, and every
answer equals the offline chain (a fresh ``Predictor`` of the folder) at the sequence the
answer names — so no request saw a half-applied model. Then a corrupt save and an
incomplete one are refused while the last good model keeps serving.
"""

from __future__ import annotations

import json
import shutil
import threading
import time

import httpx
import numpy as np
from _servetools import criteo_rows, land

from sparseps.checkpoint.predictor import Predictor
from sparseps.data import CRITEO, QueueDataset
from sparseps.files import manifest as mf
from sparseps.serving import ServeProcess

WAIT_S = 60.0  # a reload on a loaded 2-core box takes well under a second; bounded anyway


class Client(threading.Thread):
    """Posts the same rows in a loop until stopped; keeps (status, sequence, predictions)."""

    def __init__(self, url: str, rows: list[dict]) -> None:
        super().__init__(daemon=True)
        self.url, self.rows = url, rows
        self.answers: list[tuple[int, int | None, list | str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.is_set():
                try:
                    got = client.post("/predict", json={"rows": self.rows})
                except httpx.HTTPError as exc:  # a failed request: counted, not raised
                    self.answers.append((-1, None, repr(exc)))
                    continue
                body = got.json()
                self.answers.append(
                    (got.status_code, body.get("sequence"), body.get("predictions", body))
                )


def wait_for_sequence(client: httpx.Client, sequence: int) -> dict:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        model = client.get("/model").json()
        if model["sequence"] == sequence:
            return model
        time.sleep(0.05)
    raise AssertionError(f"the service did not reach sequence {sequence} in {WAIT_S} s: {model}")


def test_reloads_while_serving(chain, tmp_path):
    model_dir = tmp_path / "model"
    land(chain.folder("base-00000"), model_dir)
    rows = criteo_rows(chain.test_file)[:64]
    data = tmp_path / "rows.tsv"
    data.write_text("".join(chain.test_file.read_text().splitlines(keepends=True)[:64]))
    dataset = QueueDataset([str(data)], CRITEO, batch_size=64, threads=1)
    expected: dict[int, np.ndarray] = {0: Predictor(model_dir).predict(dataset)}
    with (
        ServeProcess(model_dir, poll_s=0.05) as service,
        httpx.Client(base_url=service.url, timeout=30) as client,
    ):
        load = Client(service.url, rows)
        load.start()
        try:
            for name in chain.saves[1:]:  # ten deltas, a new base, a delta on it
                landed = land(chain.folder(name), model_dir)
                sequence = int(name.split("-")[1])
                model = wait_for_sequence(client, sequence)
                offline = Predictor(model_dir)  # the chain at this point, loaded afresh
                assert [f.name for f in offline.saves] == [model["base"], *model["deltas"]]
                expected[sequence] = offline.predict(dataset)
                now = client.post("/predict", json={"rows": rows}).json()
                assert now["sequence"] == sequence
                np.testing.assert_array_equal(np.float32(now["predictions"]), expected[sequence])
                assert landed.is_dir()
            served = client.get("/model").json()
            assert served["base"] == "base-00011" and served["deltas"] == ["delta-00012"]
            assert served["reloads"] == {"applied": 12, "refused": 0}
            # the old base is gone from memory: the service holds one chain's rows
            assert served["bytes"] < 1.5 * Predictor(model_dir).nbytes()
        finally:
            load.stop.set()
            load.join(30)
        # every answer while reloading: no failure, and the model it names, exactly
        failed = [a for a in load.answers if a[0] != 200]
        assert not failed, failed[:3]
        seen = {sequence for _, sequence, _ in load.answers}
        assert len(load.answers) >= 20 and len(seen) >= 5, (len(load.answers), seen)
        for _, sequence, predictions in load.answers:
            np.testing.assert_array_equal(np.float32(predictions), expected[sequence])

        # a corrupt delta (a shard altered after its manifest) is refused, the model stays
        corrupt = tmp_path / "delta-00013"
        shutil.copytree(chain.folder("delta-00012"), corrupt)
        manifest = json.loads((corrupt / mf.MANIFEST).read_text())
        manifest["sequence"] = 13
        (corrupt / mf.MANIFEST).write_text(json.dumps(manifest))
        shard = next(corrupt.glob("deep_emb.delta-*.arrow"))
        shard.write_bytes(shard.read_bytes()[:-16] + b"\0" * 16)
        land(corrupt, model_dir)
        (model_dir / "delta-00014").mkdir()  # an incomplete save: no manifest
        deadline = time.monotonic() + WAIT_S
        while client.get("/model").json()["reloads"]["refused"] == 0:
            assert time.monotonic() < deadline, "the corrupt save was never refused"
            time.sleep(0.05)
        time.sleep(0.3)  # several more polls: refused once, not again
        served = client.get("/model").json()
        assert served["sequence"] == 12 and served["reloads"] == {"applied": 12, "refused": 1}
        assert "delta-00013" in served["last_refusal"] and "checksum" in served["last_refusal"]
        now = client.post("/predict", json={"rows": rows}).json()
        np.testing.assert_array_equal(np.float32(now["predictions"]), expected[12])
        metrics = client.get("/metrics").text
        assert 'sparseps_serve_reloads_total{outcome="refused"} 1.0' in metrics
        assert 'sparseps_serve_reloads_total{outcome="applied"} 12.0' in metrics
    log = service.log()
    assert log.count("refusing delta-00013") == 1
    assert log.count("delta-00014: no MANIFEST.json") == 1 or "delta-00014" in log
