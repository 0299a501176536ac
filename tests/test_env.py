"""The DESIGN §2.2 environment contract: all or nothing, errors name the variable."""

import ast
import os
import re
from pathlib import Path

import pytest

from sparseps import env
from sparseps.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

FULL = {
    "SPARSEPS_ROLE": "worker",
    "SPARSEPS_RANK": "1",
    "SPARSEPS_SERVERS": "127.0.0.1:7000,127.0.0.1:7001",
    "SPARSEPS_WORKER_NUM": "2",
    "SPARSEPS_MASTER": "127.0.0.1:7100",
    "SPARSEPS_LOG_DIR": "log",
    "SPARSEPS_JOB_ID": "job-1",
}


def test_no_variable_means_local_mode():
    assert env.from_environ({}) is None


def test_full_environment_round_trips():
    role = env.from_environ(FULL)
    assert role.role is env.Role.WORKER and role.rank == 1
    assert role.servers == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert env.from_environ(role.to_environ()) == role


@pytest.mark.parametrize("missing", env.VARIABLES)
def test_half_configured_environment_names_the_missing_variable(missing):
    partial = {k: v for k, v in FULL.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        env.from_environ(partial)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SPARSEPS_ROLE", "boss"),
        ("SPARSEPS_RANK", "one"),
        ("SPARSEPS_RANK", "5"),
        ("SPARSEPS_SERVERS", "127.0.0.1"),
        ("SPARSEPS_SERVERS", "127.0.0.1:99999"),
        ("SPARSEPS_MASTER", "nohost"),
        ("SPARSEPS_WORKER_NUM", "0"),
    ],
)
def test_malformed_variable_is_named(name, value):
    with pytest.raises(ConfigError, match=name):
        env.from_environ({**FULL, name: value})


def test_settings_parse_check_and_default_from_the_registry():
    defaults = env.settings({})
    assert defaults.rpc_timeout_s == 60.0 and defaults.reply_slots == 8 and defaults.fork_server
    assert env.settings({"SPARSEPS_RPC_TIMEOUT": "1.5"}).rpc_timeout_s == 1.5
    assert env.settings({"SPARSEPS_FORK_SERVER": "off"}).fork_server is False
    bad = [("SPARSEPS_RPC_TIMEOUT", "soon"), ("SPARSEPS_RPC_TIMEOUT", "inf"),
           ("SPARSEPS_BARRIER_WARN_S", "0"), ("SPARSEPS_REPLICAS", "-1"),
           ("SPARSEPS_REPLY_SLOTS", "65"), ("SPARSEPS_HETER_DEVICE", "tpu"),
           ("SPARSEPS_SECURE", "maybe"), ("SPARSEPS_DISK_DIR", "relative/dir"),
           ("SPARSEPS_FILE_ROOTS", "/ok" + os.pathsep + "relative"),
           ("SPARSEPS_RESTART_COUNT", "x")]  # fmt: skip
    for name, text in bad:
        with pytest.raises(ConfigError, match=name) as caught:
            env.settings({name: text})
        assert repr(text) in str(caught.value) or "relative" in str(caught.value)
    with pytest.raises(ConfigError, match="SPARSEPS_KEY_DIR is not set"):
        env.settings({"SPARSEPS_SECURE": "1"})


def test_the_process_settings_follow_the_environment(monkeypatch):
    """Read once per distinct value: a changed variable is seen, the same one is cached."""
    monkeypatch.setenv("SPARSEPS_RPC_TIMEOUT", "7")
    first = env.settings()
    assert first.rpc_timeout_s == 7.0 and env.settings() is first
    monkeypatch.setenv("SPARSEPS_RPC_TIMEOUT", "8")
    assert env.settings().rpc_timeout_s == 8.0


def test_reply_slot_bounds_are_the_transports():
    from sparseps.rpc import reply_slots

    declared = next(s for s in env.SETTINGS if s.name == env.REPLY_SLOTS)
    assert (declared.default, declared.most) == (reply_slots.DEFAULT_SLOTS, reply_slots.MAX_SLOTS)


def test_docs_env_md_is_rendered_from_the_registry():
    """docs/env.md is what ``python -m sparseps.env`` prints: regenerate it after a change."""
    from sparseps.env.docs import render_markdown

    assert (ROOT / "docs" / "env.md").read_text() == render_markdown()


def _environment_access(tree: ast.AST) -> list[int]:
    """Lines that touch the process environment: ``os.environ``/``os.getenv``/``putenv``/
    ``unsetenv``, or those names imported from ``os``."""
    names = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            lines += [node.lineno for alias in node.names if alias.name in names]
    return sorted(lines)


def test_only_the_registry_reads_the_environment():
    readers = {}
    for path in sorted((ROOT / "sparseps").rglob("*.py")):
        lines = _environment_access(ast.parse(path.read_text()))
        if lines:
            readers[str(path.relative_to(ROOT))] = lines
    assert readers == {"sparseps/env/registry.py": readers.get("sparseps/env/registry.py")}
    assert readers["sparseps/env/registry.py"]
    # the check sees each spelling
    assert _environment_access(ast.parse("import os\nos.environ.get('X')\nos.getenv('Y')")) == [
        2,
        3,
    ]
    assert _environment_access(ast.parse("from os import environ")) == [1]


def test_every_variable_named_in_the_code_is_declared():
    """A ``SPARSEPS_*`` name in any module of sparseps/ is one the registry declares."""
    declared = {s.name for s in env.SETTINGS}
    named = {
        (name, str(path.relative_to(ROOT)))
        for path in (ROOT / "sparseps").rglob("*.py")
        for name in re.findall(r"\bSPARSEPS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
    }
    assert len(named) > 30
    assert {(name, where) for name, where in named if name not in declared} == set()
