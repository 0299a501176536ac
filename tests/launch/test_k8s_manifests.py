"""``sparseps k8s``: the manifests validate against Kubernetes' schema and carry the whole
environment contract of :mod:`sparseps.env` (the list comes from there, not a copy)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sparseps import env as sps_env
from sparseps.cli import main as cli_main
from sparseps.launch.k8s import COMPLETION_INDEX

SCHEMA = kubernetes_validate.latest_version()  # bundled with the package: offline


def _write(tmp_path: Path, *extra: str) -> list[dict]:
    code = cli_main([
        "k8s", "--server-num", "3", "--worker-num", "2", "--image", "example/sparseps:1",
        "--name", "ctr", "--namespace", "rec", "--out", str(tmp_path), "--pvc", "models",
        "--worker-resources", '{"CPU": 4, "GPU": 1, "memory": "8Gi"}', *extra,
        "jobs/train.py", "--epochs", "2",
    ])  # fmt: skip
    assert code == 0
    return list(yaml.safe_load_all((tmp_path / "ctr.yaml").read_text()))


def _containers(docs: list[dict]) -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
        for d in docs
        if d["kind"] == "Job"
    }


def missing_contract(container: dict) -> list[str]:
    """The contract variables (sparseps.env.VARIABLES) a container does not set."""
    names = {e["name"] for e in container.get("env", [])}
    return [v for v in sps_env.VARIABLES if v not in names]


def test_manifests_validate_against_the_kubernetes_schema(tmp_path):
    docs = _write(tmp_path)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Service", "ctr"), ("Job", "ctr-server"), ("Job", "ctr-worker"),
    ]  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, SCHEMA, strict=True)
    # the validator does reject a broken object (so the loop above can fail)
    broken = yaml.safe_load(yaml.safe_dump(docs[1]))
    broken["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA, strict=True)


def test_every_pod_gets_the_whole_env_contract_and_stable_names(tmp_path):
    docs = _write(tmp_path)
    service, server_job, worker_job = docs
    assert service["spec"]["clusterIP"] == "None"
    for job, count in ((server_job, 3), (worker_job, 2)):
        spec = job["spec"]
        assert (spec["completionMode"], spec["completions"], spec["backoffLimit"]) == (
            "Indexed", count, 0,
        )  # fmt: skip
        pod = spec["template"]["spec"]
        assert pod["subdomain"] == service["metadata"]["name"]
        assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "models"
    containers = _containers(docs)
    for name, container in containers.items():
        assert missing_contract(container) == [], name
        values = {e["name"]: e.get("value") for e in container["env"]}
        rank = next(e for e in container["env"] if e["name"] == sps_env.RANK)
        assert rank["valueFrom"]["fieldRef"]["fieldPath"] == COMPLETION_INDEX
        # what from_environ reads in pod i (the index filled in) is a valid role
        for i in range(3 if name == "ctr-server" else 2):
            role = sps_env.from_environ({**values, sps_env.RANK: str(i)})
            assert role is not None and role.rank == i and role.job_id == "ctr"
            assert role.servers == tuple(f"ctr-server-{s}.ctr:6000" for s in range(3))
            assert role.master == "ctr-worker-0.ctr:6170"  # worker 0's stable name
            assert role.worker_num == 2
    assert containers["ctr-worker"]["resources"] == {
        "requests": {"cpu": "4", "nvidia.com/gpu": "1", "memory": "8Gi"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert containers["ctr-server"]["command"][-3:] == ["jobs/train.py", "--epochs", "2"]


def test_a_missing_contract_variable_is_caught(tmp_path):
    container = _containers(_write(tmp_path))["ctr-worker"]
    for dropped in sps_env.VARIABLES:
        cut = {**container, "env": [e for e in container["env"] if e["name"] != dropped]}
        assert missing_contract(cut) == [dropped]


def test_bad_options_name_the_flag(tmp_path, capsys):
    assert (
        cli_main(["k8s", "--image", "x", "--name", "Bad_Name", "--out", str(tmp_path), "a.py"]) == 1
    )
    assert "--name 'Bad_Name'" in capsys.readouterr().err
    code = cli_main(
        ["k8s", "--image", "x", "--worker-resources", "{", "--out", str(tmp_path), "a.py"]
    )
    assert code == 1 and "--worker-resources: not JSON" in capsys.readouterr().err


def test_the_jobs_settings_reach_every_pod_and_roots_must_be_container_paths():
    # --env and --file-root as the local launcher's children get them (the file roots
    # confine the servers' save/load: dropping them would open every path)
    from sparseps.errors import ConfigError
    from sparseps.launch.config import KubernetesConfig, LaunchConfig
    from sparseps.launch.k8s import manifests

    kube = KubernetesConfig(image="example/sparseps:1", name="ctr")
    config = LaunchConfig("train.py", backend="kubernetes", kubernetes=kube, server_num=2,
                          env={"MY_FLAG": "1"}, file_roots=("/shared/models",))  # fmt: skip
    jobs = _containers(manifests(config))
    assert sorted(jobs) == ["ctr-server", "ctr-worker"]
    for container in jobs.values():
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["MY_FLAG"] == "1" and env[sps_env.FILE_ROOTS] == "/shared/models"
    with pytest.raises(ConfigError, match="absolute"):
        LaunchConfig("train.py", backend="kubernetes", kubernetes=kube, file_roots=("models",))
