"""Hot reload under load: a client sends requests continuously while ten deltas, then a
new base and a delta on it, land in the session service's folder; zero failed requests, and every
answer equals the offline chain (a fresh ``Predictor`` of the folder) at the sequence the
answer names — so no request saw a half-applied model. Then a corrupt save and an
incomplete one are refused while the last good model keeps serving.

The session's service runs ``--workers 2``: each worker follows the chain on its own, so a
reload has landed once ``/model``'s board says every worker serves it
(``sequence_everywhere``); until then an answer may name the sequence before, and still
equals the chain at the sequence it names. "Equals": within 2.5e-7 (two float32 ulps
near 1.0), since the service gathers concurrent requests into one model call and a
call's row count changes the head's summation blocking (tests/serving/test_batching.py);
and the answer is nearer to its sequence's predictions than to any other sequence's.
"""

from __future__ import annotations

import json
import shutil
import threading

import httpx
import numpy as np
from _servetools import WORKERS, land

from sparseps.checkpoint.predictor import Predictor
from sparseps.data import CRITEO, QueueDataset
from sparseps.files import manifest as mf
from sparseps.serving import criteo_request_rows
from sparseps.testing import wait_until

PAUSE_S = 0.01
TOLERANCE = 2.5e-7
WAIT_S = 60.0  # a reload on a loaded 2-core box takes well under a second; bounded anyway


class Client(threading.Thread):
    """Posts the same rows in a loop until stopped; keeps (status, sequence, predictions).

    It pauses ``PAUSE_S`` between requests (tens of requests a second, every reload
    overlapped by several), so that on a 2-core box it leaves CPU for the reloads."""

    def __init__(self, url: str, rows: list[dict]) -> None:
        super().__init__(daemon=True)
        self.url, self.rows = url, rows
        self.answers: list[tuple[int, int | None, list | str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.wait(PAUSE_S):  # the pause: an event, so stop is prompt
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
    """``/model`` once every worker serves ``sequence``."""

    def served() -> dict | None:
        model = client.get("/model").json()
        everywhere = model["sequence_everywhere"] == sequence and model["sequence"] == sequence
        return model if everywhere else None

    return wait_until(served, WAIT_S, f"every worker serving sequence {sequence}", 0.05)


def sequence_of(name: str) -> int:
    return int(name.split("-")[1])


def assert_answer(predictions: object, sequence: int, expected: dict[int, np.ndarray]) -> None:
    """Within TOLERANCE of the chain at ``sequence``, and nearer to it than to any other."""
    got = np.float32(predictions)
    np.testing.assert_allclose(got, expected[sequence], rtol=0, atol=TOLERANCE)
    distance = {s: float(np.abs(got - e).max()) for s, e in expected.items()}
    others = [s for s, d in distance.items() if s != sequence and d <= distance[sequence]]
    assert not others, (sequence, distance)


def test_reloads_while_serving(service, client, served, chain, tmp_path):
    # (fixture order: the service starts while the chain job writes its later saves)
    """Ten deltas, a new base and a delta on it land in ``served`` under load."""
    rows = criteo_request_rows(chain.test_file)[:64]
    data = tmp_path / "rows.tsv"
    data.write_text("".join(chain.test_file.read_text().splitlines(keepends=True)[:64]))
    dataset = QueueDataset([str(data)], CRITEO, batch_size=64, threads=1)
    start = client.get("/model").json()
    offline = Predictor(served)
    assert start["sequence"] == offline.sequence
    expected: dict[int, np.ndarray] = {offline.sequence: offline.predict(dataset)}
    todo = [name for name in chain.saves if sequence_of(name) > offline.sequence]
    assert sum(name.startswith("delta") for name in todo) >= 11  # 10 before the base, 1 after
    assert sum(name.startswith("base") for name in todo) == 1
    load = Client(service.url, rows)
    load.start()
    try:
        for name in todo:
            land(chain.folder(name), served)
            model = wait_for_sequence(client, sequence_of(name))
            offline = Predictor(served)  # the chain at this point, loaded afresh
            assert [f.name for f in offline.saves] == [model["base"], *model["deltas"]]
            expected[offline.sequence] = offline.predict(dataset)
            now = client.post("/predict", json={"rows": rows}).json()
            assert now["sequence"] == offline.sequence
            assert_answer(now["predictions"], now["sequence"], expected)
        model = client.get("/model").json()
        assert model["base"] == "base-00014" and model["deltas"] == ["delta-00015"]
        assert model["reloads"]["applied"] == start["reloads"]["applied"] + len(todo)
        assert model["reloads"]["refused"] == start["reloads"]["refused"]
        # the old base is gone from memory: the service holds one chain's rows
        assert model["bytes"] == offline.nbytes()
    finally:
        load.stop.set()
        load.join(30)
    # every answer while reloading: no failure, and the model it names, exactly
    failed = [a for a in load.answers if a[0] != 200]
    assert not failed, failed[:3]
    seen = {sequence for _, sequence, _ in load.answers}
    assert len(load.answers) >= 20 and len(seen) >= 5, (len(load.answers), seen)
    for _, sequence, predictions in load.answers:
        assert_answer(predictions, sequence, expected)

    # a corrupt delta (a shard altered after its manifest) is refused, the model stays
    last = chain.saves[-1]
    corrupt_name = f"delta-{sequence_of(last) + 1:05d}"
    corrupt = tmp_path / corrupt_name
    shutil.copytree(chain.folder(last), corrupt)
    manifest = json.loads((corrupt / mf.MANIFEST).read_text())
    manifest["sequence"] = sequence_of(corrupt_name)
    (corrupt / mf.MANIFEST).write_text(json.dumps(manifest))
    shard = next(corrupt.glob("deep_emb.delta-*.arrow"))
    shard.write_bytes(shard.read_bytes()[:-16] + b"\0" * 16)
    land(corrupt, served)
    incomplete = served / f"delta-{sequence_of(last) + 2:05d}"
    incomplete.mkdir()  # an incomplete save: no manifest
    # incomplete saves landed one after another once the first is logged: each is logged
    # by a later poll of each worker than the one before it, so the corrupt save and the
    # first incomplete one have been through several whole polls once the last is logged
    # (the fixed 0.3 s here before could cover no poll at all on a loaded machine)
    markers = [served / f"delta-{sequence_of(last) + k:05d}" for k in (3, 4, 5)]
    try:
        refused = start["reloads"]["refused"] + 1
        wait_until(
            lambda: all(w["refused"] == refused for w in client.get("/model").json()["workers"]),
            WAIT_S,
            "the corrupt save refused by every worker",
            0.05,
        )
        noted = f"{incomplete.name}: no MANIFEST.json"
        for folder in [incomplete, *markers]:
            if folder is not incomplete:
                folder.mkdir()
            note = f"{folder.name}: no MANIFEST.json"  # logged once by each worker
            wait_until(lambda n=note: service.log().count(n) >= WORKERS, WAIT_S, note, 0.05)
        model = client.get("/model").json()
        assert model["sequence"] == sequence_of(last)
        assert model["reloads"]["refused"] == start["reloads"]["refused"] + 1
        assert corrupt_name in model["last_refusal"] and "checksum" in model["last_refusal"]
        now = client.post("/predict", json={"rows": rows}).json()
        assert now["sequence"] == sequence_of(last)
        assert_answer(now["predictions"], now["sequence"], expected)
        # every worker's metrics, from the one answering (each refused the same saves)
        refused = model["reloads"]["refused"]
        want = [f'sparseps_serve_reloads_total{{outcome="refused",worker="{i}"}} {refused}.0'
                for i in range(WORKERS)]  # fmt: skip
        wait_until(lambda: all(line in client.get("/metrics").text for line in want), WAIT_S,
                   "every worker's refusals in /metrics", 0.1)  # fmt: skip
        log = service.log()
        assert log.count(f"refusing {corrupt_name}") == WORKERS
        assert log.count(noted) == WORKERS
    finally:  # leave the folder a valid chain for the other tests of the session
        shutil.rmtree(served / corrupt_name)
        for folder in [incomplete, *markers]:
            if folder.is_dir():
                folder.rmdir()
