"""``--heter-device``: where each heter worker runs the dense network.

One device for every heter worker (``cuda``), or one per heter worker, in rank order
(``cuda,cuda,cpu``: heter workers 0 and 1 on a GPU, 2 on CPU cores), so one job mixes
device kinds. Each heter worker's process gets its own as ``SPARSEPS_HETER_DEVICE``; the
trainers route their steps by the throughput they measure (:mod:`sparseps.worker.heter_routing`),
so a faster device takes more of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..env import HETER_DEVICE, Role
from ..errors import ConfigError

__all__ = ["DEVICE_KINDS", "device_of", "heter_device_env", "parse_heter_devices"]

DEVICE_KINDS = ("cpu", "cuda", "auto")


def parse_heter_devices(text: str) -> tuple[str, ...]:
    """The devices of ``--heter-device`` (a kind, or a comma list of kinds).

    Raises:
        ConfigError: an unknown kind, named with the accepted ones.
    """
    devices = tuple(part.strip() for part in str(text).split(","))
    bad = [d for d in devices if d not in DEVICE_KINDS]
    if bad or not devices:
        raise ConfigError(
            f"--heter-device: expected one of {DEVICE_KINDS} or a comma list of them (one per "
            f"heter worker, e.g. cuda,cpu), got {text!r}"
        )
    return devices


def device_of(devices: tuple[str, ...], rank: int, count: int) -> str:
    """Heter worker ``rank``'s device of ``count`` heter workers.

    Raises:
        ConfigError: a list whose length is neither 1 nor ``count``.
    """
    if len(devices) not in (1, count):
        raise ConfigError(
            f"--heter-device: {len(devices)} devices ({','.join(devices)}) for {count} heter "
            "workers; give one for all or one per heter worker"
        )
    return devices[0] if len(devices) == 1 else devices[rank]


def heter_device_env(env: Mapping[str, str], role: Role, rank: int, count: int) -> dict[str, str]:
    """``env`` (the job's settings for every child, ``SPARSEPS_HETER_DEVICE`` as given to
    ``--heter-device``) for ``role`` ``rank``: a heter worker's own device, no device for
    the other roles."""
    out = dict(env)
    given = out.pop(HETER_DEVICE, None)
    if given is not None and role is Role.HETER_WORKER:
        out[HETER_DEVICE] = device_of(parse_heter_devices(given), rank, count)
    return out
