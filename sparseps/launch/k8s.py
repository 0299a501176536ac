"""``sparseps k8s``: Kubernetes manifests of a job, for ``kubectl apply -f``.

One file, ``OUT/NAME.yaml``, holds:

- a headless ``Service`` ``NAME`` (``clusterIP: None``, ``publishNotReadyAddresses``) that
  gives every pod of the job a stable DNS name ``<pod hostname>.NAME``;
- an Indexed ``Job`` ``NAME-server`` (``completionMode: Indexed``, S pods) and one
  ``NAME-worker`` (W pods). Pod ``i`` of an Indexed Job has the hostname ``<job>-<i>``
  and the annotation ``batch.kubernetes.io/job-completion-index = i``, so server ``i``
  is ``NAME-server-i.NAME:PORT`` and worker 0 (the rendezvous) ``NAME-worker-0.NAME``;
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
import re
from pathlib import Path
from typing import Any

from ..env import JOB_ID, LOG_DIR, MASTER, RANK, ROLE, SERVERS, WORKER_NUM, Role
from ..errors import ConfigError

__all__ = ["add_arguments", "manifests", "run"]

COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,40}[a-z0-9])?$")
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
    add("script", help="the script as the containers see it (in the image or on the volume)")
    add("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")


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


def _job(args: argparse.Namespace, role: Role, count: int, env: list[dict]) -> dict[str, Any]:
    name = f"{args.name}-{role.value}"
    flag = f"--{role.value}-resources"
    container: dict[str, Any] = {
        "name": role.value,
        "image": args.image,
        "workingDir": args.mount,
        "env": env,
        "resources": resources(flag, getattr(args, f"{role.value}_resources")),
        "volumeMounts": [{"name": "shared", "mountPath": args.mount}],
    }
    script = [args.script, *args.script_args]
    if role is Role.SERVER:
        container["command"] = ["python", "-u", "-m", "sparseps.observe.child", *script]
        container["ports"] = [{"name": "ps", "containerPort": args.port}]
    else:
        container["command"] = ["/bin/sh", "-c", _WORKER_SHELL, "sparseps", *script]
        container["ports"] = [{"name": "rendezvous", "containerPort": args.master_port}]
    labels = {"app.kubernetes.io/name": "sparseps", "sparseps/job": args.name,
              "sparseps/role": role.value}  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": args.namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": count,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": dict(labels)},  # a copy: no YAML anchors
                "spec": {
                    "subdomain": args.name,  # with the headless Service: stable DNS names
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [
                        {"name": "shared", "persistentVolumeClaim": {"claimName": args.pvc}}
                    ],
                },
            },
        },
    }


def manifests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The job's objects: the headless Service, then the server and worker Jobs."""
    _check(args)
    svc = args.name
    servers = ",".join(f"{args.name}-server-{i}.{svc}:{args.port}" for i in range(args.server_num))
    common = {
        SERVERS: servers,
        WORKER_NUM: str(args.worker_num),
        MASTER: f"{args.name}-worker-0.{svc}:{args.master_port}",
        LOG_DIR: f"{args.mount.rstrip('/')}/log/{args.name}",
        JOB_ID: args.name,
        "PYTHONUNBUFFERED": "1",
    }

    def env(role: Role) -> list[dict]:
        rank = {"name": RANK, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}
        plain = [{"name": k, "value": v} for k, v in {ROLE: role.value, **common}.items()]
        return [plain[0], rank, *plain[1:]]

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc, "namespace": args.namespace,
                     "labels": {"app.kubernetes.io/name": "sparseps", "sparseps/job": args.name}},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # names resolve before any readiness probe
            "selector": {"sparseps/job": args.name},
            "ports": [
                {"name": "ps", "port": args.port, "targetPort": args.port},
                {"name": "rendezvous", "port": args.master_port, "targetPort": args.master_port},
            ],
        },
    }  # fmt: skip
    return [
        service,
        _job(args, Role.SERVER, args.server_num, env(Role.SERVER)),
        _job(args, Role.WORKER, args.worker_num, env(Role.WORKER)),
    ]


def _check(args: argparse.Namespace) -> None:
    for flag, value in (("--server-num", args.server_num), ("--worker-num", args.worker_num)):
        if value < 1:
            raise ConfigError(f"{flag}: must be >= 1, got {value}")
    for flag, value in (("--name", args.name), ("--namespace", args.namespace)):
        if not _NAME.match(value):
            raise ConfigError(
                f"{flag} {value!r}: use lower-case letters, digits and '-' (a DNS label of at "
                "most 42 characters, starting with a letter)"
            )
    for flag, port in (("--port", args.port), ("--master-port", args.master_port)):
        if not 0 < port < 65536:
            raise ConfigError(f"{flag}: must be in 1..65535, got {port}")
    if args.port == args.master_port:
        raise ConfigError("--port and --master-port must differ (both are Service ports)")
    if not args.mount.startswith("/"):
        raise ConfigError(f"--mount {args.mount!r}: must be an absolute path in the container")


def run(args: argparse.Namespace) -> int:
    import yaml

    docs = manifests(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    print(f"wrote {path} (Service {args.name}, Jobs {args.name}-server x{args.server_num}, "
          f"{args.name}-worker x{args.worker_num}); apply with: kubectl apply -f {path}")  # fmt: skip
    return 0


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
