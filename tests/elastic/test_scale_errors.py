"""``sparseps scale`` refuses what it cannot do, with a clear message and exit code 1:
no job, a job that is not running, a job without a control store (multi-node, Ray),
a count below 1, a second scale while one runs, replicas, removing a server that holds a
dense table, and ``--workers`` on a job whose workers do not follow membership."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sparseps import optim
from sparseps.cli import main
from sparseps.core.routing import dense_server_of
from sparseps.launch.scaling import WORKERS_KEY, JobScaler, ScaleService
from sparseps.store.client import StoreClient
from sparseps.store.server import StoreServer
from sparseps.testing import local_cluster


def _scale(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["scale", *args])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _pids(folder, **record) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pids.json").write_text(json.dumps({"job_id": "j", "children": [], **record}))


def test_the_cli_names_what_is_wrong(tmp_path, capsys):
    code, text = _scale(capsys, str(tmp_path / "none"), "--servers", "3")
    assert code == 1 and "does not exist" in text
    _pids(tmp_path / "dead", launcher=_dead_pid(), control="127.0.0.1:1")
    code, text = _scale(capsys, str(tmp_path / "dead"), "--servers", "3")
    assert code == 1 and "is not running" in text
    _pids(tmp_path / "ray", launcher=os.getpid())  # a launcher without a control store
    code, text = _scale(capsys, str(tmp_path / "ray"), "--servers", "3")
    assert code == 1 and "one-node local launches" in text
    code, text = _scale(capsys, str(tmp_path / "ray"), "--servers", "0")
    assert code == 1 and "at least one" in text
    code, text = _scale(capsys, str(tmp_path / "ray"))
    assert code == 1 and "--servers N" in text
    with StoreServer("127.0.0.1", 0) as server:  # a control store with a scale running
        _pids(tmp_path / "busy", launcher=os.getpid(), control=server.address)
        with StoreClient(server.address, timeout_s=5, setting="-") as store:
            store.add("scale/busy", 1)
            code, text = _scale(capsys, str(tmp_path / "busy"), "--servers", "3")
            assert code == 1 and "another scale" in text
            assert store.add("scale/busy", 0) == 1  # the refused request left the lock as it was


class _NoSupervisor:
    """A running job's supervisor that must start nothing."""

    def begin_change(self) -> str:
        return ""  # the job runs: requests are served (and refused on their merits)

    def end_change(self) -> None:
        pass

    def add_child(self, spec):  # pragma: no cover - a refused scale starts nothing
        raise AssertionError(f"started {spec}")


def test_the_launcher_refuses_replicas_dense_removal_and_workers_without_membership():
    with local_cluster(servers=2, timeout=30) as cluster:
        endpoints = list(cluster.endpoints)

        def scaler(**options) -> JobScaler:
            return JobScaler(supervisor=_NoSupervisor(), endpoints=endpoints,
                             new_server=None, new_worker=None, host="127.0.0.1",
                             **options)  # type: ignore[arg-type]  # fmt: skip

        with pytest.raises(Exception, match="replicas"):
            scaler(replicas=1).servers(3)
        with pytest.raises(Exception, match="at least one server"):
            scaler().servers(0)
        with cluster.client() as client:  # a dense table on the server a shrink removes
            name = next(n for n in (f"dense{i}" for i in range(64))
                        if dense_server_of(n, client.num_servers) == 1)  # fmt: skip
            client.create_dense(name, 4, optim.SGD(lr=0.1), np.zeros(4, np.float32))
        with pytest.raises(Exception, match=rf"holds dense table\(s\) \['{name}'\]"):
            scaler().servers(1)
        # the refusals changed nothing: no placement, both servers serve
        with cluster.client() as client:
            assert client.refresh_placement() is None
            assert len(client.ping()) == 2
        with StoreServer("127.0.0.1", 0) as store_server:  # the workers' store
            refused = scaler(master=lambda: store_server.address)
            with pytest.raises(Exception, match="sparseps online"):
                refused.worker_scaling.workers(3, 2)
            with StoreClient(store_server.address, timeout_s=5, setting="-") as store:
                assert not store.check([WORKERS_KEY])  # nothing announced


def test_a_malformed_request_gets_an_error_and_the_service_lives_on():
    scaler = JobScaler(supervisor=_NoSupervisor(), endpoints=["127.0.0.1:1"],
                       new_server=None, new_worker=None, host="127.0.0.1",
                       replicas=1)  # type: ignore[arg-type]  # fmt: skip
    service = ScaleService(scaler, "127.0.0.1", workers=1)
    try:
        with StoreClient(service.address, timeout_s=5, setting="-") as store:
            for n, request in enumerate([b"not json", b"[1, 2]", b'{"id": "a", "servers": 2}']):
                store.set("scale/request", request)
                if n == 2:
                    store.wait(["scale/result/a"])
                    result = json.loads(store.get("scale/result/a"))
                    assert not result["ok"] and "replicas" in result["error"]
    finally:
        service.close()
