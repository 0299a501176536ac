"""``sparseps k8s`` with a heter role (issue 57, item 5): a job with two device kinds
renders one StatefulSet per kind, each with its own resources, that validate against the
Kubernetes schema; every pod knows every heter worker's stable name, and a heter pod's
rank (its kind's offset plus its ordinal, computed by its shell) is a valid role."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sparseps import env as sps_env
from sparseps.cli import main as cli_main

SCHEMA = kubernetes_validate.latest_version()  # bundled with the package: offline
RESOURCES = '{"cuda": {"CPU": 2, "GPU": 1, "memory": "8Gi"}, "cpu": {"CPU": 8, "memory": "4Gi"}}'


def _write(tmp_path: Path, *extra: str) -> list[dict]:
    code = cli_main([
        "k8s", "--server-num", "2", "--worker-num", "4", "--image", "example/sparseps:1",
        "--name", "ctr", "--namespace", "rec", "--out", str(tmp_path), "--heter-worker-num", "3",
        "--heter-device", "cuda,cpu,cuda", *extra, "jobs/train.py",
    ])  # fmt: skip
    assert code == 0
    return list(yaml.safe_load_all((tmp_path / "ctr.yaml").read_text()))


def test_two_device_kinds_render_a_statefulset_each_and_validate(tmp_path):
    docs = _write(tmp_path, "--heter-resources", RESOURCES)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Service", "ctr"), ("Job", "ctr-server"), ("Job", "ctr-worker"),
        ("StatefulSet", "ctr-heter-cuda"), ("StatefulSet", "ctr-heter-cpu"),
    ]  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, SCHEMA, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(docs[3]))
    broken["spec"]["replicass"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA, strict=True)
    service, cuda, cpu = docs[0], docs[3], docs[4]
    assert {"name": "heter", "port": 6200, "targetPort": 6200} in service["spec"]["ports"]
    assert (cuda["spec"]["replicas"], cpu["spec"]["replicas"]) == (2, 1)
    for heter_set in (cuda, cpu):
        spec = heter_set["spec"]
        assert spec["serviceName"] == "ctr"
        assert (
            spec["selector"]["matchLabels"].items()
            <= spec["template"]["metadata"]["labels"].items()
        )
        assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    gpu = cuda["spec"]["template"]["spec"]["containers"][0]["resources"]
    cores = cpu["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert gpu == {"requests": {"cpu": "2", "nvidia.com/gpu": "1", "memory": "8Gi"},
                   "limits": {"nvidia.com/gpu": "1"}}  # fmt: skip
    assert cores == {"requests": {"cpu": "8", "memory": "4Gi"}}


def test_every_pod_knows_the_heter_workers_and_heter_ranks_are_valid(tmp_path):
    docs = _write(tmp_path)
    endpoints = (
        "ctr-heter-cuda-0.ctr:6200",
        "ctr-heter-cuda-1.ctr:6200",
        "ctr-heter-cpu-0.ctr:6200",
    )
    for doc in docs[1:]:
        container = doc["spec"]["template"]["spec"]["containers"][0]
        values = {e["name"]: e.get("value") for e in container["env"]}
        assert values[sps_env.HETER_WORKERS] == ",".join(endpoints), doc["metadata"]["name"]
    for doc, offset in ((docs[3], 0), (docs[4], 2)):
        container = doc["spec"]["template"]["spec"]["containers"][0]
        values = {e["name"]: e.get("value") for e in container["env"]}
        kind = doc["metadata"]["labels"]["sparseps/device"]
        assert values[sps_env.HETER_DEVICE] == kind
        # the rank the pod's own shell computes from its hostname (the StatefulSet ordinal)
        shell = container["command"][2].replace(
            'exec python -u -m sparseps.observe.child "$@"', f'echo "${sps_env.RANK}"'
        )
        for ordinal in range(doc["spec"]["replicas"]):
            done = subprocess.run(
                ["/bin/sh", "-c", shell, "sparseps"], capture_output=True, text=True, check=True,
                env={"HOSTNAME": f"ctr-heter-{kind}-{ordinal}", "PATH": "/usr/bin:/bin"},
            )  # fmt: skip
            rank = int(done.stdout)
            assert rank == offset + ordinal
            assert endpoints[rank].startswith(f"ctr-heter-{kind}-{ordinal}.")
            role = sps_env.from_environ({**values, sps_env.RANK: str(rank)})
            assert role is not None and role.role is sps_env.Role.HETER_WORKER
            assert role.heter_workers == endpoints and role.rank == rank


def test_default_heter_resources_and_bad_heter_options(tmp_path, capsys):
    docs = _write(tmp_path)
    requests = [d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
                for d in docs[3:]]  # fmt: skip
    assert requests[0]["nvidia.com/gpu"] == "1" and "nvidia.com/gpu" not in requests[1]
    bad = [
        (["--heter-device", "tpu"], "--heter-device: expected one of"),
        (["--heter-device", "cuda,cpu"], "2 devices (cuda,cpu) for 3 heter workers"),
        (["--heter-resources", '{"cuda": {"CPU": 1}}', "--heter-device", "cuda,cpu,cpu"],
         "no entry for device kind 'cpu'"),
        (["--heter-port", "6000"], "must differ"),
    ]  # fmt: skip
    for extra, message in bad:
        code = cli_main(["k8s", "--image", "x", "--name", "ctr", "--out", str(tmp_path),
                         "--heter-worker-num", "3", *extra, "a.py"])  # fmt: skip
        assert code == 1, extra
        assert message in capsys.readouterr().err, extra
    # no heter workers: the manifests of before (no StatefulSet, no heter variables)
    assert cli_main(["k8s", "--image", "x", "--name", "plain", "--out", str(tmp_path), "a.py"]) == 0
    plain = list(yaml.safe_load_all((tmp_path / "plain.yaml").read_text()))
    assert [d["kind"] for d in plain] == ["Service", "Job", "Job"]
    assert all(sps_env.HETER_WORKERS not in str(d) for d in plain)
