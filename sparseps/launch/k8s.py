"""``sparseps k8s``: Kubernetes manifests of a job, for ``kubectl apply -f``.

One file, ``OUT/NAME.yaml``, holds:

- a headless ``Service`` ``NAME`` (``clusterIP: None``, ``publishNotReadyAddresses``) that
  gives every pod of the job a stable DNS name ``<pod hostname>.NAME``;
- an Indexed ``Job`` ``NAME-server`` (``completionMode: Indexed``, S pods) and one
  ``NAME-worker`` (W pods). Pod ``i`` of an Indexed Job has the hostname ``<job>-<i>``
  and the annotation ``batch.kubernetes.io/job-completion-index = i``, so server ``i``
  is ``NAME-server-i.NAME:PORT`` and worker 0 (the rendezvous) ``NAME-worker-0.NAME``;
- with heter workers (``--heter-worker-num H``, docs/heterps.md) one ``StatefulSet``
  ``NAME-heter-KIND`` per device kind of ``--heter-device`` (``cuda,cuda,cpu``: two on
  GPUs, one on CPU cores), each with its own resources (``--heter-resources``, per kind),
  pods named ``NAME-heter-KIND-<ordinal>.NAME:HETER_PORT``; the heter ranks are the kinds'
  pods in order (``SPARSEPS_HETER_WORKERS``), a pod's rank its kind's offset plus its
  ordinal. A StatefulSet restarts a heter worker that dies (the trainers count the steps
  they lose and wait for it); delete it with the rest once the job completed;
- in every pod the whole environment contract of :mod:`sparseps.env` (``SPARSEPS_RANK``
  from the completion index through the downward API), the role's resources, and the
  shared volume (a PersistentVolumeClaim, ``--pvc``) mounted at ``--mount`` for data,
  checkpoints, inference models and ``SPARSEPS_LOG_DIR``.

Fail fast: ``backoffLimit: 0`` and ``restartPolicy: Never`` (a lone restarted worker
cannot rejoin a gloo group). When every worker has finished, worker 0 asks the servers
to stop (``python -m sparseps.launch.k8s``), which completes the server Job.
docs/cluster.md shows the apply steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..env import (
    HETER_DEVICE,
    HETER_WORKERS,
    JOB_ID,
    LOG_DIR,
    MASTER,
    RANK,
    ROLE,
    SERVERS,
    WORKER_NUM,
    Role,
)
from ..errors import ConfigError
from .config import KubernetesConfig, LaunchConfig
from .heter_devices import device_of, parse_heter_devices
from .records import Outcome

__all__ = [
    "KubernetesBackend",
    "add_arguments",
    "heter_endpoints",
    "heter_groups",
    "manifests",
    "render",
    "run",
]

COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
_DEFAULT_RESOURCES = '{"CPU": 1, "memory": "2Gi"}'  # a server's or a worker's pod
_RESOURCE_NAMES = {"CPU": "cpu", "GPU": "nvidia.com/gpu", "memory": "memory"}
# Worker 0 stops the servers once it has finished (sps.stop() waited for every worker).
_WORKER_SHELL = (
    'python -u -m sparseps.observe.child "$@"; code=$?; '
    'if [ "$code" -eq 0 ] && [ "$SPARSEPS_RANK" = 0 ]; then python -m sparseps.launch.k8s; fi; '
    'exit "$code"'
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--server-num", dest="server_num", type=int, default=1, help="servers (default 1)")
    add("--worker-num", dest="worker_num", type=int, default=1, help="workers (default 1)")
    add("--image", required=True, help="container image with Python, sparseps and the script")
    add("--name", default="sparseps", help="job name: prefix of every object (default sparseps)")
    add("--namespace", default="default", help="namespace of every object (default default)")
    add("--out", default="k8s", help="folder the manifest file is written to (default ./k8s)")
    add("--port", type=int, default=6000, help="every server's port (default 6000)")
    add("--master-port", dest="master_port", type=int, default=6170,
        help="worker 0's rendezvous port (default 6170)")  # fmt: skip
    add("--pvc", default="sparseps-shared",
        help="PersistentVolumeClaim of the shared volume (ReadWriteMany; default sparseps-shared)")  # fmt: skip
    add("--mount", default="/shared",
        help="where every pod mounts the shared volume; the working folder (default /shared)")  # fmt: skip
    add("--server-resources", dest="server_resources", default='{"CPU": 1, "memory": "2Gi"}',
        metavar="JSON", help='each server pod\'s requests, e.g. \'{"CPU": 4, "memory": "16Gi"}\'')  # fmt: skip
    add("--worker-resources", dest="worker_resources", default='{"CPU": 1, "memory": "2Gi"}',
        metavar="JSON", help='each worker pod\'s requests, e.g. \'{"CPU": 8, "GPU": 1}\'')  # fmt: skip
    add("--heter-worker-num", dest="heter_worker_num", type=int, default=0,
        help="heter workers: the dense network runs on them (default none; docs/heterps.md)")  # fmt: skip
    add("--heter-device", dest="heter_device", default=None,
        help="their device kind, or one per heter worker, e.g. cuda,cpu (default cpu)")  # fmt: skip
    add("--heter-resources", dest="heter_resources", default=None, metavar="JSON",
        help='each heter pod\'s requests: one object for every kind, or one per kind, e.g. '
             '\'{"cuda": {"CPU": 2, "GPU": 1}, "cpu": {"CPU": 8}}\' (default: a GPU for cuda '
             'and auto, 2 CPUs for cpu, 4Gi)')  # fmt: skip
    add("--heter-port", dest="heter_port", type=int, default=6200,
        help="every heter worker's port (default 6200)")  # fmt: skip
    add("script", help="the script as the containers see it (in the image or on the volume)")
    add("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    parser.set_defaults(backend="kubernetes")  # LaunchConfig.from_args: its kubernetes part


def _kube(config: LaunchConfig) -> KubernetesConfig:
    if config.kubernetes is None:
        raise ConfigError("the kubernetes backend needs LaunchConfig(kubernetes=KubernetesConfig(image=...))")  # fmt: skip
    return config.kubernetes


def resources(flag: str, text: str) -> dict[str, dict[str, str]]:
    """``{"requests": ..., "limits": ...}`` from the JSON of ``flag`` (``CPU``, ``GPU``,
    ``memory`` or Kubernetes names; GPUs are limits too, as Kubernetes requires)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f'{flag}: not JSON ({exc}); e.g. \'{{"CPU": 2, "memory": "4Gi"}}\''
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object, got {text!r}")
    requests: dict[str, str] = {}
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float | str):
            raise ConfigError(f"{flag}: {name!r} must be a number or a quantity, got {amount!r}")
        if isinstance(amount, float) and amount.is_integer():
            amount = int(amount)
        requests[_RESOURCE_NAMES.get(name) or name] = str(amount)
    limits = {k: v for k, v in requests.items() if k.endswith("/gpu")}
    return {"requests": requests, **({"limits": limits} if limits else {})}


def _job(config: LaunchConfig, role: Role, count: int, env: list[dict]) -> dict[str, Any]:
    kube = _kube(config)
    name = f"{kube.name}-{role.value}"
    flag = f"--{role.value}-resources"
    container: dict[str, Any] = {
        "name": role.value,
        "image": kube.image,
        "workingDir": kube.mount,
        "env": env,
        "resources": resources(
            flag, getattr(config, f"{role.value}_resources") or _DEFAULT_RESOURCES
        ),
        "volumeMounts": [{"name": "shared", "mountPath": kube.mount}],
    }
    script = [config.script, *config.script_args]
    if role is Role.SERVER:
        container["command"] = ["python", "-u", "-m", "sparseps.observe.child", *script]
        container["ports"] = [{"name": "ps", "containerPort": kube.port}]
    else:
        container["command"] = ["/bin/sh", "-c", _WORKER_SHELL, "sparseps", *script]
        container["ports"] = [{"name": "rendezvous", "containerPort": kube.master_port}]
    labels = {"app.kubernetes.io/name": "sparseps", "sparseps/job": kube.name,
              "sparseps/role": role.value}  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": kube.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": count,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": dict(labels)},  # a copy: no YAML anchors
                "spec": {
                    "subdomain": kube.name,  # with the headless Service: stable DNS names
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [
                        {"name": "shared", "persistentVolumeClaim": {"claimName": kube.pvc}}
                    ],
                },
            },
        },
    }


_HETER_DEFAULTS = {
    "cuda": '{"CPU": 2, "GPU": 1, "memory": "4Gi"}',
    "auto": '{"CPU": 2, "GPU": 1, "memory": "4Gi"}',
    "cpu": '{"CPU": 2, "memory": "4Gi"}',
}


def heter_groups(config: LaunchConfig) -> list[tuple[str, int]]:
    """``(device kind, heter workers)`` per StatefulSet, in heter rank order."""
    count = config.heter_worker_num or 0
    if not count:
        return []
    devices = parse_heter_devices(config.heter_device or "cpu")
    kinds = [device_of(devices, r, count) for r in range(count)]
    return [(kind, kinds.count(kind)) for kind in dict.fromkeys(kinds)]


def _heter_resources(config: LaunchConfig, kind: str) -> dict[str, dict[str, str]]:
    given = config.heter_resources
    if not given:
        return resources("--heter-resources", _HETER_DEFAULTS[kind])
    try:
        value = json.loads(given)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, dict) and value and all(k in _HETER_DEFAULTS for k in value):
        if kind not in value:
            raise ConfigError(f"--heter-resources: no entry for device kind {kind!r}")
        return resources(f"--heter-resources {kind}", json.dumps(value[kind]))
    return resources("--heter-resources", given)


def _heter_sets(config: LaunchConfig, env: list[dict]) -> list[dict[str, Any]]:
    """One StatefulSet per device kind: the heter workers of that kind."""
    kube = _kube(config)
    out, offset = [], 0
    for kind, count in heter_groups(config):
        name = f"{kube.name}-heter-{kind}"
        labels = {"app.kubernetes.io/name": "sparseps", "sparseps/job": kube.name,
                  "sparseps/role": Role.HETER_WORKER.value, "sparseps/device": kind}  # fmt: skip
        # the rank: this kind's offset in SPARSEPS_HETER_WORKERS plus the pod's ordinal
        shell = (f'export {RANK}=$(({offset} + ${{HOSTNAME##*-}})); '
                 'exec python -u -m sparseps.observe.child "$@"')  # fmt: skip
        container = {
            "name": "heter-worker",
            "image": kube.image,
            "workingDir": kube.mount,
            "command": ["/bin/sh", "-c", shell, "sparseps", config.script, *config.script_args],
            "env": [*env, {"name": HETER_DEVICE, "value": kind}],
            "resources": _heter_resources(config, kind),
            "ports": [{"name": "heter", "containerPort": kube.heter_port}],
            "volumeMounts": [{"name": "shared", "mountPath": kube.mount}],
        }
        out.append({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": kube.namespace, "labels": labels},
            "spec": {
                "serviceName": kube.name,  # the headless Service: stable DNS names
                "replicas": count,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "containers": [container],
                        "volumes": [
                            {"name": "shared", "persistentVolumeClaim": {"claimName": kube.pvc}}
                        ],
                    },
                },
            },
        })  # fmt: skip
        offset += count
    return out


def heter_endpoints(config: LaunchConfig) -> list[str]:
    """``host:port`` of every heter worker, in rank order (the StatefulSets' pod names)."""
    kube = _kube(config)
    return [
        f"{kube.name}-heter-{kind}-{i}.{kube.name}:{kube.heter_port}"
        for kind, count in heter_groups(config)
        for i in range(count)
    ]


def manifests(config: LaunchConfig) -> list[dict[str, Any]]:
    """The job's objects: the headless Service, the server and worker Jobs, then one
    heter StatefulSet per device kind."""
    kube = _kube(config)
    _check(config)
    svc = kube.name
    servers = ",".join(
        f"{kube.name}-server-{i}.{svc}:{kube.port}" for i in range(_count(config.server_num))
    )
    heter = heter_endpoints(config)
    # the job's settings (--env, file roots) as the local launcher's children get them;
    # each heter set names its own device kind
    settings = {k: v for k, v in config.child_settings().items() if k != HETER_DEVICE}
    common = {
        **settings,
        **({HETER_WORKERS: ",".join(heter)} if heter else {}),
        SERVERS: servers,
        WORKER_NUM: str(_count(config.worker_num)),
        MASTER: f"{kube.name}-worker-0.{svc}:{kube.master_port}",
        LOG_DIR: f"{kube.mount.rstrip('/')}/log/{kube.name}",
        JOB_ID: kube.name,
        "PYTHONUNBUFFERED": "1",
    }

    def env(role: Role) -> list[dict]:
        rank = {"name": RANK, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}
        plain = [{"name": k, "value": v} for k, v in {ROLE: role.value, **common}.items()]
        return [plain[0], rank, *plain[1:]]

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc, "namespace": kube.namespace,
                     "labels": {"app.kubernetes.io/name": "sparseps", "sparseps/job": kube.name}},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # names resolve before any readiness probe
            "selector": {"sparseps/job": kube.name},
            "ports": [
                {"name": "ps", "port": kube.port, "targetPort": kube.port},
                {"name": "rendezvous", "port": kube.master_port, "targetPort": kube.master_port},
                *([{"name": "heter", "port": kube.heter_port, "targetPort": kube.heter_port}]
                  if heter else []),
            ],
        },
    }  # fmt: skip
    heter_env = [e for e in env(Role.HETER_WORKER) if e["name"] != RANK]  # set by the shell
    return [
        service,
        _job(config, Role.SERVER, _count(config.server_num), env(Role.SERVER)),
        _job(config, Role.WORKER, _count(config.worker_num), env(Role.WORKER)),
        *_heter_sets(config, heter_env),
    ]


def _count(value: int | None) -> int:
    return 1 if value is None else value  # sparseps k8s: one server, one worker by default


def _check(config: LaunchConfig) -> None:
    """What the manifests need of the job beyond :class:`KubernetesConfig`'s own checks."""
    kube = _kube(config)
    for flag, value in (("--server-num", config.server_num), ("--worker-num", config.worker_num)):
        if _count(value) < 1:
            raise ConfigError(f"{flag}: must be >= 1, got {value}")
    heter = config.heter_worker_num or 0
    if heter < 0:
        raise ConfigError(f"--heter-worker-num: must be >= 0, got {heter}")
    ports = [kube.port, kube.master_port, *([kube.heter_port] if heter else [])]
    if len(set(ports)) != len(ports):
        raise ConfigError(
            "--port, --master-port and --heter-port must differ (all are Service ports)"
        )


def render(config: LaunchConfig) -> Path:
    """Write the job's manifests to ``OUT/NAME.yaml`` (for ``kubectl apply -f``) and say so;
    nothing starts here."""
    import yaml

    kube = _kube(config)
    docs = manifests(config)
    out = Path(kube.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{kube.name}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    heter = "".join(f", StatefulSet {kube.name}-heter-{kind} x{count}"
                    for kind, count in heter_groups(config))  # fmt: skip
    print(f"wrote {path} (Service {kube.name}, Jobs {kube.name}-server "
          f"x{_count(config.server_num)}, {kube.name}-worker x{_count(config.worker_num)}"
          f"{heter}); apply with: kubectl apply -f {path}")  # fmt: skip
    return path


class KubernetesBackend:
    """The ``kubernetes`` backend: the job as Kubernetes objects (:func:`render`); the
    cluster runs them once applied, so the outcome is ``rendered``, never a job's end."""

    name = "kubernetes"

    def launch(self, config: LaunchConfig) -> Outcome:
        render(config)
        return Outcome(0, "rendered")


def run(args: argparse.Namespace) -> int:
    """``sparseps k8s``: the manifests of the command line's job."""
    from .launch_cli import launch

    return launch(LaunchConfig.from_args(args)).exit_code


def stop_servers() -> None:
    """Worker 0's last step in a pod: ask every server of its job to stop."""
    from ..env import from_environ
    from ..rpc.client import PSClient

    role = from_environ()
    if role is None:
        raise ConfigError("python -m sparseps.launch.k8s: run it inside a job's worker pod")
    security = None
    if role.key_dir:
        from ..rpc.security import JobKeys, Security

        security = Security(JobKeys.load(role.key_dir))
    with PSClient(list(role.servers), timeout=30.0, job_id=role.job_id, security=security) as c:
        c.stop_servers()


if __name__ == "__main__":  # pragma: no cover - runs in a pod
    stop_servers()
