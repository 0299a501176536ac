"""A PSClient is made of parts it holds (issue 53): a channel, a router and a ClientConfig.

- ``ClientConfig`` checks every field when it is made, naming the field and the value;
  ``PSClient(endpoints, timeout=...)`` builds one from its keywords, and a config and
  keywords together are refused;
- the plain data path never touches the placement router: a client of a job that never
  scales asks it for the servers' placement before a table-wide call (that is how it would
  learn the job turned elastic) and never during a keyed call, a dense call or a cluster
  call (shown with a router that records every call made to it);
- a client that follows no placement never imports sparseps.elastic at all.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sparseps import optim
from sparseps.config import TableConfig
from sparseps.errors import ConfigError
from sparseps.rpc.client import ClientConfig, PSClient
from sparseps.rpc.protocol import Limits
from sparseps.testing import local_cluster

pytestmark = pytest.mark.timeout(120)

CONFIG = TableConfig(name="emb", dim=4, rule=optim.Adagrad(lr=0.1), seed=5)
KEYS = np.arange(1, 2001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("timeout", 0, "timeout must be a finite number of seconds > 0, got 0"),
        ("timeout", float("inf"), "timeout must be a finite number"),
        ("file_timeout", -1.0, "file_timeout must be a finite number"),
        ("placement_retry_s", True, "placement_retry_s must be a finite number"),
        ("max_in_flight", 0, "max_in_flight must be an int >= 1, got 0"),
        ("update_retries", -1, "update_retries must be an int >= 0, got -1"),
        ("reply_slots", 65, "reply_slots must be an int in 0..64, got 65"),
        ("replicas", -1, "replicas must be an int >= 0, got -1"),
        ("job_id", "a job", "job_id must be 1-128 characters"),
        ("limits", {"max_message_bytes": 1}, "limits must be a Limits"),
        ("follow_placement", 1, "follow_placement must be True or False, got 1"),
    ],
)  # fmt: skip
def test_a_bad_setting_is_refused_naming_the_field_and_value(field, value, says):
    with pytest.raises(ConfigError, match=says):
        ClientConfig(**{field: value})
    with pytest.raises(ConfigError, match=says):  # the keywords build the same config
        PSClient(["127.0.0.1:9"], **{field: value})


def test_the_config_holds_the_settings_in_force(monkeypatch):
    monkeypatch.setenv("SPARSEPS_RPC_TIMEOUT", "7.5")
    monkeypatch.setenv("SPARSEPS_JOB_ID", "job-1")
    monkeypatch.setenv("SPARSEPS_REPLY_SLOTS", "0")
    config = ClientConfig()
    assert (config.timeout, config.job_id, config.reply_slots) == (7.5, "job-1", 0)
    assert config.timeout_setting == "PSClient(timeout=...) or SPARSEPS_RPC_TIMEOUT"
    given = ClientConfig(timeout=3, job_id="job-2", limits=Limits(max_message_bytes=1 << 20))
    assert (given.timeout, given.job_id, given.timeout_setting) == (
        3.0,
        "job-2",
        "PSClient(timeout=...)",
    )
    with pytest.raises(AttributeError):
        config.timeout = 1.0  # type: ignore[misc]  # frozen


def test_a_client_takes_a_config_or_keywords_not_both():
    config = ClientConfig(timeout=4.0, update_retries=2, follow_placement=False)
    with PSClient(["127.0.0.1:9"], config=config) as client:
        assert client.config is config
        assert (client.timeout, client.placement_retry_s, client.placement) == (4.0, 60.0, None)
    with PSClient(["127.0.0.1:9"], timeout=4.0, update_retries=2, follow_placement=False) as kw:
        assert kw.config == config
    with pytest.raises(ConfigError, match="not both .*timeout"):
        PSClient(["127.0.0.1:9"], config=config, timeout=5.0)


class RecordingRouter:
    """A placement router that records each call made to it (and never finds a placement)."""

    made: list[RecordingRouter] = []

    def __init__(self, channel, *, num_servers: int, retry_s: float) -> None:
        self.calls: list[str] = []
        self.refreshes = self.move_waits = 0
        RecordingRouter.made.append(self)

    @property
    def placement(self):
        self.calls.append("placement")
        return None

    def refresh(self):
        self.calls.append("refresh")
        return None

    def __getattr__(self, name: str):  # group, send, table_wide, take_over, ...
        raise AssertionError(f"the plain path called the placement router's {name}")


def test_the_plain_data_path_never_touches_the_placement_router():
    RecordingRouter.made.clear()
    with (
        local_cluster(servers=2, timeout=30) as cluster,
        PSClient(cluster.endpoints, timeout=30, placement_routing=RecordingRouter) as client,
    ):
        (router,) = RecordingRouter.made
        client.create_table(CONFIG)  # table-wide: the servers are asked for a placement
        assert router.calls == ["refresh"]
        grads = np.ones((len(KEYS), 4), np.float32)
        client.push("emb", KEYS, grads).wait()
        client.push_delta("emb", KEYS[:10], grads[:10]).wait()
        client.prefetch("emb", KEYS).wait()
        rows = client.pull("emb", KEYS).wait()
        np.testing.assert_array_equal(client.pull("emb", KEYS, dedup=True).wait(), rows)
        full = client.pull_full("emb", KEYS).wait()
        client.write_rows("emb", KEYS, full).wait()
        client.create_dense("head", 8, optim.SGD(lr=1.0))
        client.push_dense("head", np.ones(8, np.float32)).wait()
        client.pull_dense("head").wait()
        client.stats()
        client.ping()
        client.replica_status()
        assert router.calls == ["refresh"]  # nothing more: no keyed, dense or cluster call
        assert client.placement is None and client.refreshes == 0
        client.decay("emb")
        assert router.calls == ["refresh", "refresh"]


def test_a_client_that_follows_no_placement_never_imports_elastic(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        from sparseps import optim
        from sparseps.config import TableConfig
        from sparseps.rpc.client import PSClient

        with PSClient(sys.argv[1].split(","), timeout=30, follow_placement=False) as client:
            client.create_table(TableConfig(name="emb", dim=4, rule=optim.SGD(lr=1.0)))
            keys = np.arange(1, 100, dtype=np.uint64)
            client.push("emb", keys, np.ones((99, 4), np.float32)).wait()
            client.pull("emb", keys).wait()
            client.stats()
        print(sorted(m for m in sys.modules if m.startswith("sparseps.elastic")))
        """
    )
    with local_cluster(servers=2, timeout=30) as cluster:
        out = subprocess.run([sys.executable, "-c", script, ",".join(cluster.endpoints)],
                             capture_output=True, text=True, timeout=90, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
