"""Who runs where: the cluster spec of one job and the share of it that runs on this node.

A job has S servers (``host:port`` each, index = server rank), W workers (a host each,
index = worker rank) and one rendezvous endpoint (``master``) where worker 0 hosts the
``torch.distributed`` store the workers meet at. On one machine every port is picked
free; across machines the user lists the servers and worker hosts and each node's
launcher starts the entries whose host equals its ``--host``.

Example (two nodes, one server and one worker each)::

    servers = ("10.0.0.1:6000", "10.0.0.2:6000")
    workers = ("10.0.0.1", "10.0.0.2")
    master  = "10.0.0.1:6170"        # worker 0's host, DEFAULT_MASTER_PORT
    # node 10.0.0.1 runs server 0 and worker 0; node 10.0.0.2 runs server 1 and worker 1
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import secrets
import time
from dataclasses import dataclass

from ..env import Role, RoleEnv, parse_endpoint
from ..errors import ConfigError
from ..rpc import transport

__all__ = [
    "CONTROL_PORT_OFFSET",
    "DEFAULT_MASTER_PORT",
    "ClusterSpec",
    "free_ports",
    "make_spec",
    "new_job_id",
]

# Rendezvous port on worker 0's host when a multi-node job gives no --master. Every node
# must derive the same endpoint without talking to the others, hence a fixed number.
DEFAULT_MASTER_PORT = 6170
# The launchers of a multi-node job coordinate (fail fast, "all workers done") through a
# store hosted by the launcher on the master host, at the master port plus this offset.
CONTROL_PORT_OFFSET = 1


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct TCP ports that are free on ``host`` right now
    (:func:`sparseps.rpc.transport.free_ports`: drawn outside the ephemeral range).

    Raises:
        ConfigError: ``host`` is not an address of this machine.
    """
    try:
        return transport.free_ports(host, count)
    except OSError as exc:
        raise ConfigError(
            f"--host {host!r}: cannot bind a port on it ({exc}); give an address of this machine"
        ) from None


def new_job_id(kind: str = "sps") -> str:
    """A fresh job id: ``KIND-YYYYmmdd-HHMMSS-`` and 6 random hex digits (a job launched
    from one place; a multi-node job's launchers derive theirs from the layout instead)."""
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _split(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def _worker_host(entry: str) -> str:
    # fleetrun writes workers as host:port; the port means nothing here (gloo uses master)
    host, sep, port = entry.rpartition(":")
    return host if sep and port.isdigit() else entry


@dataclass(frozen=True)
class ClusterSpec:
    """The whole job as every node sees it, plus which node this is.

    Attributes:
        servers: ``host:port`` of each server; index = server rank.
        workers: host of each worker; index = worker rank.
        master: ``host:port`` of the workers' rendezvous store (hosted by worker 0).
        host: the address of this node; it runs the entries whose host equals it.
        job_id: shared by every process of the job (``SPARSEPS_JOB_ID``).
        log_dir: folder of the per-role logs (absolute).
        key_dir: the job's key folder (absolute) when its sockets use CURVE, else empty
            (``SPARSEPS_KEY_DIR``; docs/security.md).
        heter_workers: ``host:port`` of each heter worker (``SPARSEPS_HETER_WORKERS``;
            docs/heterps.md), empty when the job has none.
    """

    servers: tuple[str, ...]
    workers: tuple[str, ...]
    master: str
    host: str
    job_id: str
    log_dir: str
    key_dir: str = ""
    heter_workers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError("--server-num: a job needs at least one server")
        if not self.workers:
            raise ConfigError("--worker-num: a job needs at least one worker")
        for i, endpoint in enumerate(self.servers):
            parse_endpoint(endpoint, what=f"--servers entry {i}")
        if len(set(self.servers)) != len(self.servers):
            raise ConfigError(f"--servers: an endpoint is listed twice in {','.join(self.servers)}")
        for i, endpoint in enumerate(self.heter_workers):
            parse_endpoint(endpoint, what=f"--heter-workers entry {i}")
        if set(self.heter_workers) & set(self.servers) or len(set(self.heter_workers)) != len(
            self.heter_workers
        ):
            raise ConfigError(
                f"--heter-workers: every endpoint must be distinct and not a server's, got "
                f"{','.join(self.heter_workers)}"
            )
        master_host, _ = parse_endpoint(self.master, what="--master")
        if master_host != self.workers[0]:
            raise ConfigError(
                f"--master {self.master}: worker 0 hosts the rendezvous store, so the master "
                f"host must be worker 0's host {self.workers[0]!r}"
            )
        if self.host not in self.nodes:
            raise ConfigError(
                f"--host {self.host!r} runs nothing: it is not a host in --servers or "
                f"--workers ({', '.join(self.nodes)})"
            )

    @property
    def nodes(self) -> tuple[str, ...]:
        """Distinct hosts of the job, in order of first appearance (workers first)."""
        hosts = list(self.workers) + [
            parse_endpoint(s)[0] for s in (*self.servers, *self.heter_workers)
        ]
        return tuple(dict.fromkeys(hosts))

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    @property
    def secure(self) -> bool:
        """Whether every socket of the job uses CURVE with the keys in :attr:`key_dir`."""
        return bool(self.key_dir)

    @property
    def loopback_only(self) -> bool:
        """Every host is a loopback address: no other machine can reach the job's ports."""
        return all(_is_loopback(h) for h in self.nodes)

    @property
    def control_endpoint(self) -> str:
        """Where the launchers of a multi-node job coordinate (master port + offset)."""
        host, port = parse_endpoint(self.master)
        return f"{host}:{port + CONTROL_PORT_OFFSET}"

    @property
    def is_control_host(self) -> bool:
        return self.host == parse_endpoint(self.master)[0]

    def local_servers(self) -> list[int]:
        """Ranks of the servers this node runs."""
        return [r for r, ep in enumerate(self.servers) if parse_endpoint(ep)[0] == self.host]

    def local_workers(self) -> list[int]:
        """Ranks of the workers this node runs."""
        return [r for r, h in enumerate(self.workers) if h == self.host]

    def local_heter_workers(self) -> list[int]:
        """Ranks of the heter workers this node runs."""
        return [r for r, ep in enumerate(self.heter_workers) if parse_endpoint(ep)[0] == self.host]

    def role_env(self, role: Role, rank: int) -> RoleEnv:
        """The DESIGN §2.2 role of one process of this job."""
        return RoleEnv(
            role=role,
            rank=rank,
            servers=self.servers,
            worker_num=len(self.workers),
            master=self.master,
            log_dir=self.log_dir,
            job_id=self.job_id,
            key_dir=self.key_dir,
            heter_workers=self.heter_workers,
        )

    def describe(self) -> str:
        """The configuration banner the launcher prints."""
        servers_here, workers_here = set(self.local_servers()), set(self.local_workers())

        def mark(here: bool) -> str:
            return "" if not self.multi_node else (" (this node)" if here else "")

        lines = [
            "----------- sparseps launch -----------",
            f"job id      : {self.job_id}",
            f"this node   : {self.host}",
            f"servers     : {len(self.servers)}",
            *(f"  server {r}: {ep}{mark(r in servers_here)}" for r, ep in enumerate(self.servers)),
            *(
                f"  heter worker {r}: {ep}{mark(parse_endpoint(ep)[0] == self.host)}"
                for r, ep in enumerate(self.heter_workers)
            ),  # fmt: skip
            f"workers     : {len(self.workers)}",
            *(f"  worker {r}: {h}{mark(r in workers_here)}" for r, h in enumerate(self.workers)),
            f"rendezvous  : {self.master}",
            f"log dir     : {self.log_dir}",
            f"transport   : {f'CURVE, keys in {self.key_dir}' if self.secure else 'plain'}",
            "---------------------------------------",
        ]
        return "\n".join(lines)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume other machines can reach it
        return False


def _key_dir(
    secure: bool | None, key_dir: str | None, log_dir: str, hosts: list[str], single_node: bool
) -> str:
    """The job's key folder, or "" for plain transport (the rule in docs/security.md)."""
    if key_dir:
        if secure is False:
            raise ConfigError("--key-dir and --no-secure contradict each other; drop one")
        return os.path.abspath(os.path.expanduser(key_dir))
    if secure is None:
        # On by default once another machine can reach the job's ports.
        secure = not all(_is_loopback(h) for h in hosts)
    if not secure:
        return ""
    if not single_node:
        raise ConfigError(
            f"--key-dir is required: this --secure job spans hosts ({', '.join(hosts)}) and "
            "every host needs the same keys; make them once with `sparseps keys DIR`, copy DIR "
            "to every host (scp -rp keeps its 0700/0600 modes) and pass --key-dir DIR to every "
            "launcher (or --no-secure on a trusted network)"
        )
    # One node: the launcher makes fresh keys for this job inside the log dir.
    return os.path.join(os.path.abspath(log_dir), "keys")


def _count(name: str, given: int | None, listed: list[str], flag: str) -> int | None:
    if given is not None and given < 1:
        raise ConfigError(f"--{name}: must be >= 1, got {given}")
    if listed and given is not None and given != len(listed):
        raise ConfigError(f"--{name} {given} disagrees with {flag} ({len(listed)} entries)")
    return len(listed) if listed else given


def make_spec(
    *,
    server_num: int | None = None,
    worker_num: int | None = None,
    servers: str | None = None,
    workers: str | None = None,
    host: str | None = None,
    master: str | None = None,
    log_dir: str = "log",
    job_id: str | None = None,
    secure: bool | None = None,
    key_dir: str | None = None,
    heter_worker_num: int | None = None,
    heter_workers: str | None = None,
) -> ClusterSpec:
    """Resolve the command-line options into a :class:`ClusterSpec`.

    Args:
        server_num, worker_num: counts (default 1 each); must agree with the lists if both
            are given.
        servers: ``host:port,...``; without it, ``server_num`` servers on ``host`` with
            free ports.
        workers: ``host,...`` (``host:port`` accepted, port ignored); without it,
            ``worker_num`` workers on ``host``.
        host: this node's address. Default: ``127.0.0.1``, or the only host the lists name.
        master: rendezvous ``host:port``. Default: a free port when the job runs on this
            node only, else worker 0's host and :data:`DEFAULT_MASTER_PORT`.
        log_dir: per-role log folder (made absolute).
        job_id: default: random on one node; a hash of the layout across nodes, so that
            every node's launcher derives the same id.
        secure: CURVE on every socket (True), plain (False), or None: on when a host is
            not a loopback address. Implied by ``key_dir``.
        key_dir: the job's key folder; required when a secure job spans hosts. A secure
            one-node job without it gets ``LOG_DIR/keys`` (the launcher writes fresh keys).
        heter_worker_num, heter_workers: heter workers (default none): a count (on
            ``host``, free ports) or ``host:port,...`` (required across nodes).

    Raises:
        ConfigError: naming the option that is inconsistent and how to fix it.
    """
    server_list = _split(servers)
    worker_list = [_worker_host(w) for w in _split(workers)]
    n_servers = _count("server-num", server_num, server_list, "--servers") or 1
    n_workers = _count("worker-num", worker_num, worker_list, "--workers") or 1
    listed_hosts = list(
        dict.fromkeys(worker_list + [parse_endpoint(s, what="--servers")[0] for s in server_list])
    )
    if host is None:
        if len(listed_hosts) > 1:
            raise ConfigError(
                f"--host is required: --servers/--workers span several hosts "
                f"({', '.join(listed_hosts)}); give the address of this node"
            )
        host = listed_hosts[0] if listed_hosts else "127.0.0.1"
    worker_hosts = tuple(worker_list) if worker_list else (host,) * n_workers
    if not server_list and any(h != host for h in worker_hosts):
        raise ConfigError(
            "--servers is required when workers run on other hosts: every node must know "
            "every server endpoint (host:port,...)"
        )
    single_node = all(h == host for h in worker_hosts) and all(
        parse_endpoint(s)[0] == host for s in server_list
    )
    heter_list = _split(heter_workers)
    n_heter = _count("heter-worker-num", heter_worker_num, heter_list, "--heter-workers") or 0
    if n_heter and not heter_list and not single_node:
        raise ConfigError(
            "--heter-workers is required across nodes: every node must know every heter "
            "worker endpoint (host:port,...)"
        )
    wanted = (0 if server_list else n_servers) + (0 if master or not single_node else 1)
    wanted += 0 if heter_list else n_heter
    ports = free_ports(host, wanted) if wanted else []
    own_heter = 0 if heter_list else n_heter  # the last ports are the heter workers'
    heter_eps = tuple(heter_list) or tuple(f"{host}:{p}" for p in ports[len(ports) - own_heter :])
    ports = ports[: len(ports) - own_heter]
    server_eps = (
        tuple(server_list) if server_list else tuple(f"{host}:{p}" for p in ports[:n_servers])
    )
    if master is None:
        master = (
            f"{host}:{ports[-1]}" if single_node else f"{worker_hosts[0]}:{DEFAULT_MASTER_PORT}"
        )
    if job_id is None:
        if single_node:
            job_id = new_job_id()
        else:
            layout = "|".join([",".join(server_eps), ",".join(worker_hosts), master])
            job_id = "sps-" + hashlib.sha1(layout.encode()).hexdigest()[:12]
    spec = ClusterSpec(
        servers=server_eps,
        workers=worker_hosts,
        master=master,
        host=host,
        job_id=job_id,
        log_dir=os.path.abspath(log_dir),
        heter_workers=heter_eps,
    )
    # After the layout validated: its errors come first, the key rule needs a valid layout.
    return dataclasses.replace(
        spec, key_dir=_key_dir(secure, key_dir, log_dir, list(spec.nodes), single_node)
    )
