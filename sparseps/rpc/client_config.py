"""``ClientConfig``: how a :class:`~sparseps.rpc.client.PSClient` talks to its servers.

One frozen record, checked when it is made: each bad field raises a
:class:`~sparseps.errors.ConfigError` naming the field, the value and what is accepted.
``PSClient(endpoints, timeout=..., ...)`` builds one from its keyword arguments;
``PSClient(endpoints, config=ClientConfig(...))`` takes one made elsewhere (a tool that
opens several clients alike).

A setting left None takes the job's value from the environment (the launcher sets it for
every process of a job: ``SPARSEPS_RPC_TIMEOUT``, ``SPARSEPS_FILE_TIMEOUT``,
``SPARSEPS_JOB_ID``, ``SPARSEPS_REPLICAS``, ``SPARSEPS_REPLY_SLOTS``,
``SPARSEPS_SECURE``/``SPARSEPS_KEY_DIR``), else the default; the record holds the value in
force, read once when it is made.

Example::

    config = ClientConfig(timeout=10.0, update_retries=2)
    with PSClient(endpoints, config=config) as client:
        ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import env
from ..errors import ConfigError
from .protocol import JOB_ID, Limits
from .reply_slots import MAX_SLOTS
from .security import Security, security_from_env

__all__ = [
    "DEFAULT_FILE_TIMEOUT",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_PLACEMENT_RETRY_S",
    "DEFAULT_TIMEOUT",
    "ClientConfig",
]

_DEFAULTS = env.settings({})  # the registry's defaults
DEFAULT_TIMEOUT = _DEFAULTS.rpc_timeout_s
DEFAULT_FILE_TIMEOUT = _DEFAULTS.file_timeout_s
DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_PLACEMENT_RETRY_S = 60.0


def _seconds(name: str, value: object) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not value > 0
    ):
        raise ConfigError(f"PSClient: {name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _count(name: str, value: object, least: int, most: int | None = None) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < least
        or (most is not None and value > most)
    ):
        accepted = f"an int >= {least}" if most is None else f"an int in {least}..{most}"
        raise ConfigError(f"PSClient: {name} must be {accepted}, got {value!r}")
    return value


@dataclass(frozen=True)
class ClientConfig:
    """The settings of a client (module docstring: None takes the environment's value).

    Attributes:
        timeout: seconds any wait may take (default 60, or ``SPARSEPS_RPC_TIMEOUT``).
        max_in_flight: requests outstanding at once over all servers (default 64); a
            caller that would exceed it waits for replies (up to ``timeout``).
        limits: message size limits (default :class:`~sparseps.rpc.protocol.Limits`).
        security: the job's CURVE keys (:class:`~sparseps.rpc.security.Security`);
            default: from ``SPARSEPS_SECURE``/``SPARSEPS_KEY_DIR``, plain transport when
            unset. A server that refuses this client's key fails its calls at once with an
            :class:`~sparseps.errors.UnavailableError` saying so.
        job_id: the job these servers belong to (default ``SPARSEPS_JOB_ID``); sent with
            every request, and a server of another job refuses it (servers started
            without a job id accept any).
        file_timeout: seconds a save or load may take (default 1800, or
            ``SPARSEPS_FILE_TIMEOUT``): file ops are slow by nature and must not share the
            data plane's timeout, which should stay short to detect a dead server fast.
        update_retries: times a push whose server did not answer within ``timeout`` is
            sent again (default 0). Each push carries the client's sequence number and a
            server applies it once, so a retry never doubles an update.
        replicas: backup copies of every shard, as the servers were started (default
            ``SPARSEPS_REPLICAS``, else 0; checked against the server count by the
            client). With replicas, writes go to each shard's head copy, which passes
            them down the chain (:mod:`sparseps.rpc.replicated`, docs/replication.md).
        follow_placement: route by the servers' placement once they hold one (an elastic
            job, :mod:`sparseps.elastic.routing`; default True). False pins the client to
            its endpoint list (the migration driver's one-server clients).
        placement_retry_s: seconds a request refused for a placement reason (a virtual
            shard moving between servers) is resent for before the call fails (default 60).
        reply_slots: slots of shared memory asked of each server on this host, where it
            writes pull answers instead of sending them over loopback TCP (default 8 of
            2 MiB, or ``SPARSEPS_REPLY_SLOTS``; 0: never; :mod:`sparseps.rpc.reply_slots`).
            Rows answered into a slot are arrays over that memory; the slot is reused once
            they are garbage, and while every slot is held, answers travel over the socket.
        timeout_setting: how a user changes ``timeout`` (named in timeout errors; derived).

    Raises:
        ConfigError: a timeout that is not a finite number > 0, max_in_flight < 1,
            update_retries < 0, reply_slots outside 0..64, replicas < 0, a malformed job
            id, limits that are not :class:`Limits`, or a malformed environment variable
            (named).
    """

    timeout: float | None = None
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    limits: Limits = field(default_factory=Limits)
    security: Security | None = None
    job_id: str | None = None
    file_timeout: float | None = None
    update_retries: int = 0
    replicas: int | None = None
    follow_placement: bool = True
    placement_retry_s: float = DEFAULT_PLACEMENT_RETRY_S
    reply_slots: int | None = None
    timeout_setting: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)  # frozen: only while it is made

        if self.timeout is None:
            put("timeout", env.settings().rpc_timeout_s)
            put("timeout_setting", f"PSClient(timeout=...) or {env.RPC_TIMEOUT}")
        else:
            put("timeout_setting", "PSClient(timeout=...)")
        put("timeout", _seconds("timeout", self.timeout))
        if self.file_timeout is None:
            put("file_timeout", env.settings().file_timeout_s)
        put("file_timeout", _seconds("file_timeout", self.file_timeout))
        put("placement_retry_s", _seconds("placement_retry_s", self.placement_retry_s))
        _count("max_in_flight", self.max_in_flight, 1)
        _count("update_retries", self.update_retries, 0)
        if self.reply_slots is None:
            put("reply_slots", env.settings().reply_slots)
        _count("reply_slots", self.reply_slots, 0, MAX_SLOTS)
        if self.replicas is None:
            put("replicas", env.settings().replicas)
        _count("replicas", self.replicas, 0)
        if self.job_id is None:
            put("job_id", env.job_id_setting())
        if self.job_id is not None and not (
            isinstance(self.job_id, str) and JOB_ID.fullmatch(self.job_id)
        ):
            raise ConfigError(
                "PSClient: job_id must be 1-128 characters from [A-Za-z0-9_.:-], "
                f"got {self.job_id!r}"
            )
        if self.security is None:
            put("security", security_from_env())
        if not isinstance(self.limits, Limits):
            raise ConfigError(f"PSClient: limits must be a Limits, got {self.limits!r}")
        if not isinstance(self.follow_placement, bool):
            raise ConfigError(
                f"PSClient: follow_placement must be True or False, got {self.follow_placement!r}"
            )
