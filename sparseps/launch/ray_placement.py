"""Where the roles of a ``--backend ray`` job run: resources, the placement group, the
role actors, and the checks the driver makes before anything starts.

One placement-group bundle per server, heter worker and worker (``SPREAD``: spread over
the nodes as far as the resources allow; a heter worker's bundle asks for a GPU where the
cluster has one for each, :func:`heter_resources`), one :class:`~sparseps.launch.ray_actor.RoleActor` per
bundle. Each actor checks on its node that the paths the role needs exist there (the
script, the working folder, ``--file-root`` and ``--key-dir`` folders) and picks the
role's ports on its node; :func:`place_roles` gathers both. ``ray_backend.py`` starts
and supervises the processes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..env import Role
from ..errors import ConfigError
from .heter_devices import device_of, parse_heter_devices

if TYPE_CHECKING:
    from .config import LaunchConfig

__all__ = [
    "CALL_TIMEOUT_S",
    "RoleHandle",
    "actor_options",
    "call",
    "check_config",
    "heter_resources",
    "key_dir_rule",
    "new_actor",
    "parse_resources",
    "place_roles",
    "prepare_roles",
    "release",
    "role_paths",
    "role_resources",
]

DEFAULT_RESOURCES = '{"CPU": 1}'
CALL_TIMEOUT_S = 60.0  # one actor call (prepare, start, poll, stop) answers within this
_REFUSED = {"servers": "--servers", "workers": "--workers", "host": "--host",
            "master": "--master", "status_port": "--status-port",
            # Ray places heter workers (--heter-worker-num) and picks their ports
            "heter_workers": "--heter-workers"}  # fmt: skip


def parse_resources(flag: str, text: str) -> dict[str, float]:
    """``--server-resources`` / ``--worker-resources``: a JSON object of amounts > 0."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f'{flag}: not JSON ({exc}); e.g. \'{{"CPU": 1, "node_b": 0.1}}\''
        ) from None
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{flag}: expected a JSON object of resource amounts, got {text!r}")
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not amount > 0:
            raise ConfigError(f"{flag}: {name!r} must be a number > 0, got {amount!r}")
    return {str(k): float(v) for k, v in value.items()}


def role_resources(config: LaunchConfig) -> tuple[dict[str, float], dict[str, float]]:
    """The bundles of a server and of a worker (``--server-resources``/``--worker-resources``)."""
    return (
        parse_resources("--server-resources", config.server_resources or DEFAULT_RESOURCES),
        parse_resources("--worker-resources", config.worker_resources or DEFAULT_RESOURCES),
    )


def heter_resources(config: LaunchConfig, cluster: dict[str, float]) -> dict[str, float]:
    """A heter worker's bundle: ``--heter-resources``, else a CPU and, where the cluster
    has a GPU for every heter worker, a GPU (``cluster``: ``ray.cluster_resources()``)."""
    if config.heter_resources:
        return parse_resources("--heter-resources", config.heter_resources)
    count = config.heter_worker_num or 0
    gpus = float(cluster.get("GPU", 0.0))
    return {"CPU": 1.0, **({"GPU": 1.0} if count and gpus >= count else {})}


def actor_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray actor options asking for ``resources`` (CPU, GPU, memory or custom ones)."""
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
    return {
        "num_cpus": resources.get("CPU", 0),
        "num_gpus": resources.get("GPU", 0),
        **({"memory": resources["memory"]} if "memory" in resources else {}),
        **({"resources": custom} if custom else {}),
    }


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class RoleHandle:
    """The driver's view of one role: its actor, where it runs, its process's state."""

    role: Role
    rank: int
    actor: Any
    log_path: Path
    host: str = ""
    ports: list[int] = field(default_factory=list)
    pid: int = 0
    attempt: int = 0
    offset: int = 0
    code: int | None = None
    running: bool = False
    actor_died: bool = False
    last_output: float = 0.0  # time.monotonic() of its last log bytes
    warned_at: float = 0.0  # of the last "no output" warning

    @property
    def name(self) -> str:
        return f"{self.role.value} {self.rank}"


def call(ray, refs: list, what: str, timeout: float = CALL_TIMEOUT_S, *, raw: bool = False) -> list:
    """``ray.get(refs)`` bounded by ``timeout``; failures become a ConfigError naming
    ``what`` (with ``raw``, a dead actor's RayActorError is raised as is)."""
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return ray.get(refs, timeout=timeout)
    except GetTimeoutError:
        raise ConfigError(
            f"--backend ray: the actors did not answer {what} within {timeout:g} s "
            "(is a node overloaded or gone?)"
        ) from None
    except RayActorError as exc:
        if raw:
            raise
        raise ConfigError(f"--backend ray: a role's actor died during {what}: {exc}") from None


def place_roles(
    ray, config: LaunchConfig, job_id: str, script: Path, log_dir: Path
) -> tuple[Any, list[RoleHandle]]:
    """Reserve the bundles, create the actors, check paths and gather ports on each node.

    Returns:
        the placement group and the roles (servers, heter workers, then workers),
        ``host``/``ports`` set.

    Raises:
        ConfigError: the cluster cannot fit the bundles within ``--rendezvous-timeout-s``,
            or a path is missing on a node (named with the node and the path).
    """
    from ray.util.placement_group import placement_group

    server_res, worker_res = role_resources(config)
    heter_res = heter_resources(config, dict(ray.cluster_resources()))
    layout = (
        [(Role.SERVER, r, server_res) for r in range(config.server_num or 1)]
        + [(Role.HETER_WORKER, r, heter_res) for r in range(config.heter_worker_num or 0)]
        + [(Role.WORKER, r, worker_res) for r in range(config.worker_num or 1)]
    )
    pg = placement_group([res for _, _, res in layout], strategy="SPREAD")
    if not pg.wait(int(max(1, config.rendezvous_timeout_s))):
        raise ConfigError(
            f"--backend ray: Ray could not place {len(layout)} bundles (servers "
            f"{server_res}, workers {worker_res}"
            + (f", heter workers {heter_res}" if config.heter_worker_num else "")
            + f") within {config.rendezvous_timeout_s:g} s "
            f"(--rendezvous-timeout-s); the cluster has {ray.available_resources()}: lower "
            "--server-resources/--worker-resources/--heter-resources or add nodes"
        )
    roles: list[RoleHandle] = []
    try:
        for i, (role, rank, res) in enumerate(layout):
            actor = new_actor(ray, role, rank, job_id, res, pg, i)
            roles.append(RoleHandle(role, rank, actor, log_dir / f"{role.value}.{rank}.log"))
        metrics = 1 if config.metrics else 0
        # a port to listen on: servers, heter workers, worker 0 (the rendezvous)
        wants = [
            1 + metrics if r.role is not Role.WORKER or r.rank == 0 else metrics for r in roles
        ]
        prepare_roles(ray, roles, role_paths(config, script), wants)
    except BaseException:
        release(ray, pg, roles)
        raise

    return pg, roles


def new_actor(ray, role: Role, rank: int, job_id: str, resources: dict[str, float], pg,
              index: int):  # fmt: skip
    """A :class:`RoleActor` for ``role`` ``rank`` in bundle ``index`` of ``pg``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from .ray_actor import RoleActor

    strategy = PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index
    )
    return ray.remote(RoleActor).options(
        **actor_options(resources), scheduling_strategy=strategy, max_restarts=0,
        name=f"{job_id}-{role.value}-{rank}", max_concurrency=1,
    ).remote(role.value, rank, job_id)  # fmt: skip


def role_paths(config: LaunchConfig, script: Path) -> dict[str, str]:
    """What -> path for every path a role needs on its node."""
    paths = {"script": str(script), "working folder": os.getcwd()}
    for i, root in enumerate(config.file_roots or ()):
        paths[f"--file-root {i}"] = os.path.abspath(root)
    if config.key_dir:
        paths["--key-dir"] = os.path.abspath(config.key_dir)
    return paths


def prepare_roles(ray, roles: list[RoleHandle], paths: dict[str, str], ports: list[int]) -> None:
    """Check ``paths`` on each role's node and pick its ``ports``; sets ``host``/``ports``.

    Raises:
        ConfigError: a path is missing on a node (named with the node and the path).
    """
    infos = call(
        ray, [r.actor.prepare.remote(paths, n) for r, n in zip(roles, ports, strict=True)],
        "prepare",
    )  # fmt: skip
    for r, info in zip(roles, infos, strict=True):
        if info["error"]:
            raise ConfigError(f"--backend ray: {info['error']}")
        r.host, r.ports = info["host"], list(info["ports"])


def key_dir_rule(config: LaunchConfig, nodes: tuple[str, ...], here: str, log_dir: Path) -> str:
    """The job's key folder ("" for plain transport): the local launcher's rule
    (docs/security.md) over the hosts Ray chose; ``here`` is the driver's node address."""
    if config.key_dir:
        if config.secure is False:
            raise ConfigError("--key-dir and --no-secure contradict each other; drop one")
        return os.path.abspath(config.key_dir)
    secure = config.secure if config.secure is not None else not all(map(_loopback, nodes))
    if not secure:
        return ""
    if any(h != here for h in nodes):
        raise ConfigError(
            f"--key-dir is required: this secure job runs on Ray nodes {', '.join(nodes)} "
            "and every node needs the same keys; make them with `sparseps keys DIR` on a "
            "shared filesystem and pass --key-dir DIR (or --no-secure on a trusted network)"
        )
    from ..rpc.security import write_job_keys

    key_dir = str(log_dir / "keys")
    write_job_keys(key_dir, force=True)
    return key_dir


def release(ray, pg, roles: list[RoleHandle]) -> None:
    """Kill the actors (their children die with them) and free the placement group."""
    for r in roles:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(r.actor, no_restart=True)
    if pg is not None:
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):  # the cluster went away
            remove_placement_group(pg)


def check_config(config: LaunchConfig) -> Path:
    """What a Ray job refuses beyond :class:`LaunchConfig`'s own checks; the script's path."""
    for name, flag in _REFUSED.items():
        if getattr(config, name) is not None:
            raise ConfigError(
                f"{flag} does not apply to --backend ray: Ray places the roles and each "
                "picks its ports on its node; use --server-resources/--worker-resources "
                "to steer placement"
            )
    heter = config.heter_worker_num or 0
    if (config.heter_device or config.heter_resources) and not heter:
        raise ConfigError("--heter-device/--heter-resources: the job has no heter workers "
                          "(--heter-worker-num H)")  # fmt: skip
    if config.heter_device:
        device_of(parse_heter_devices(config.heter_device), 0, heter)
    for name in ("server_num", "worker_num"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1, got {value}")
    script = Path(config.script).resolve()
    if not script.is_file():
        raise ConfigError(f"launch: script {config.script!r} not found (cwd {os.getcwd()})")
    return script
