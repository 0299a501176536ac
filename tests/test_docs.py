"""The Python in the README and docs/ is checked: every ```python block runs, or, when the
line before its fence is ``<!-- fragment: why -->`` (it uses a trainer, a batch or a
service set up elsewhere), every sparseps name it reaches exists and every call of one
binds its arguments.

Running blocks: each in a fresh interpreter, in document order, all in one folder that
holds the files the examples read (``data/train`` and ``data/test``, Criteo TSV), so a
block may use what an earlier one wrote (docs/serving.md serves the README's
``out/infer``). Checking fragments (and the running blocks too, before they run): the
block's ``sparseps`` imports and attribute chains (``sps.metrics.ReportConfig``) must
resolve, a call of a resolved function or class must bind its keywords and positional
count, and so must a method call on a name known to hold an instance: assigned from a
sparseps class's call in the block, or a name the docs use for one (``TYPICAL_NAMES``).
A fragment's names that it does not import are looked up as the docs write them: ``sps``
is ``sparseps``, and a bare public name (``QueueDataset``) is the front door's.

The commands the docs show (``sparseps COMMAND ...`` in inline code and shell blocks): the
command exists and takes every option written (a script's own options after it aside).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import sparseps as sps
from sparseps.data.synthetic import write_dataset
from sparseps.env import ZYGOTE_DIR

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# names the docs use for objects made elsewhere in a job, and what they hold
TYPICAL_NAMES = {"trainer": sps.Trainer, "client": sps.PSClient, "c": sps.PSClient}
# where a fragment's bare names come from when it does not import them: ``sps`` and the
# public names of the front door's packages (a name two of them export differently: none)
_PACKAGES = ("sparseps", "sparseps.config", "sparseps.data", "sparseps.metrics",
             "sparseps.models", "sparseps.online", "sparseps.recall", "sparseps.serving",
             "sparseps.table")  # fmt: skip
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```python\n(?P<code>.*?)^(?P=indent)```", re.M | re.S)
_FRAGMENT = re.compile(r"<!--\s*fragment:\s*(?P<why>\S.*?)\s*-->\s*$")
# A block runs as a script would, with log lines that name their level: an example that
# logs an error (or worse) or a Python warning (a deprecated call, a read-only buffer
# handed to torch) fails, as one that raises does. At its end the block's garbage is
# collected (what its finalizers log still counts), then the heap is frozen: the
# interpreter's last collections would walk every object left, torch's modules first,
# 2-4 s per torch block on a loaded box (launched roles do the same,
# sparseps/observe/child.py); atexit handlers and reference counts still close the rest.
_RUNNER = (
    "import gc, logging, sys\n"
    "logging.basicConfig(format='%(levelname)s %(name)s: %(message)s')\n"
    "try:\n"
    "    exec(compile(sys.stdin.read(), sys.argv[1], 'exec'), {'__name__': '__main__'})\n"
    "finally:\n"
    "    gc.collect()\n"
    "    gc.freeze()\n"
)
_ERROR_LINE = re.compile(r"^(\S+ \S+ )?(ERROR|CRITICAL) |^\S+:\d+: \w*Warning: ")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    code: str
    fragment: str | None  # why it does not run on its own (None: it runs)

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    for path in DOCS:
        text = path.read_text()
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _FRAGMENT.search(before)
            code = textwrap.dedent(match.group("code"))
            out.append(Block(path, line, code, marker.group("why") if marker else None))
    return out


BLOCKS = _blocks()
_MISSING = object()


def _public_names() -> dict[str, object]:
    found: dict[str, list] = {}
    for name in _PACKAGES:
        module = importlib.import_module(name)
        for attr in module.__all__:
            found.setdefault(attr, []).append(getattr(module, attr))
    unique = {a: v[0] for a, v in found.items() if all(x is v[0] for x in v)}
    return {"sps": sps, **unique}


PUBLIC_NAMES = _public_names()


class _Names(ast.NodeVisitor):
    """What a block's sparseps names resolve to, and what does not resolve or bind."""

    def __init__(self, tree: ast.AST) -> None:
        bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                 and isinstance(n.ctx, ast.Store)} | {a.arg for a in ast.walk(tree)
                 if isinstance(a, ast.arg)}  # fmt: skip
        # a name -> a module, class or function (the block's own names are its own)
        self.values = {k: v for k, v in PUBLIC_NAMES.items() if k not in bound}
        self.instances: dict[str, type] = dict(TYPICAL_NAMES)  # a name -> its class
        self.problems: list[str] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "sparseps":
                module = self._import(alias.name, node)
                if module is not None:
                    top = alias.asname or "sparseps"
                    self.values[top] = module if alias.asname else importlib.import_module(top)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not node.module or node.module.split(".")[0] != "sparseps":
            return
        module = self._import(node.module, node)
        for alias in node.names if module is not None else ():
            value = getattr(module, alias.name, _MISSING)
            if value is _MISSING:
                value = self._import(f"{node.module}.{alias.name}", node)
            if value is not None:
                self.values[alias.asname or alias.name] = value

    def _import(self, name: str, node: ast.AST):
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            self._report(f"line {node.lineno}: cannot import {name}: {exc}")
            return None

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        made = self._resolve(node.value.func) if isinstance(node.value, ast.Call) else None
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.values.pop(target.id, None)
                self.instances.pop(target.id, None)
                if inspect.isclass(made):
                    self.instances[target.id] = made

    def _resolve(self, node: ast.AST):
        """The object ``node`` (a name or an attribute chain) names; None when unknown."""
        if isinstance(node, ast.Name):
            return self.values.get(node.id)
        if not isinstance(node, ast.Attribute):
            return None
        owner = self._resolve(node.value)
        if owner is None:
            return None
        value = getattr(owner, node.attr, _MISSING)
        if value is _MISSING:
            where = ast.unparse(node.value)
            self._report(f"line {node.lineno}: {where} has no attribute {node.attr!r}")
            return None
        return value

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._resolve(node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        target, bound = self._resolve(node.func), False
        func = node.func
        if target is None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            cls = self.instances.get(func.value.id)
            if cls is not None:
                target = getattr(cls, func.attr, _MISSING)
                if target is _MISSING:
                    self._report(f"line {node.lineno}: {cls.__name__} has no method {func.attr!r}")
                    return
                bound = True
        if target is None or not callable(target):
            return
        self._bind(node, target, bound)

    def _bind(self, node: ast.Call, target, bound: bool) -> None:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            return  # *args / **kwargs: the count and names are not known here
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin without a signature
            return
        args = [None] * (len(node.args) + bound)
        try:
            signature.bind_partial(*args, **{k.arg: None for k in node.keywords})
        except TypeError as exc:
            self._report(f"line {node.lineno}: {ast.unparse(node.func)}(...): {exc}")

    def _report(self, problem: str) -> None:
        if problem not in self.problems:  # a call's name is resolved as a call and as a name
            self.problems.append(problem)


def _problems(block: Block) -> list[str]:
    tree = ast.parse(block.code)
    names = _Names(tree)
    names.visit(tree)
    return names.problems


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Where the running blocks run, with the data files the examples read."""
    root = tmp_path_factory.mktemp("docs")
    write_dataset(root / "data", rows=3000, seed=1, files=2, test_rows=1000)
    return root


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_the_docs_python_runs_or_names_what_exists(block: Block, folder: Path):
    problems = _problems(block)
    assert not problems, f"{block}:\n" + "\n".join(problems)
    if block.fragment is not None:
        return
    # no role of this process leaks into the block; the zygotes' folder does (the suite's
    # jobs use it, tests/conftest.py): a local server forks from a warm zygote instead of
    # importing sparseps again (sparseps/runtime/local.py, ~1.5 CPU-s a server)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPS_") or k == ZYGOTE_DIR}
    done = subprocess.run([sys.executable, "-c", _RUNNER, str(block)], input=block.code,
                          cwd=folder, env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, (
        f"{block} failed (a block that needs what it cannot have here is marked with "
        f"'<!-- fragment: why -->' on the line before its fence):\n{done.stderr[-3000:]}"
    )
    errors = [line for line in done.stderr.splitlines() if _ERROR_LINE.search(line)]
    assert not errors, f"{block} logged errors or warnings:\n" + "\n".join(errors)


def test_the_checks_catch_what_they_are_for():
    """A misspelt name, a keyword the function does not take, and a missing method are
    each reported (so the test above can fail)."""
    code = textwrap.dedent("""\
        import sparseps as sps
        from sparseps.metrics import CTRMetrics
        sps.metrics.ReportConfg()
        CTRMetrics(buckets=4)
        trainer = sps.Trainer(None)
        trainer.train_from_datasets(None)
        """)
    problems = _problems(Block(ROOT / "README.md", 1, code, fragment="a test"))
    assert len(problems) == 3, problems
    assert "no attribute 'ReportConfg'" in problems[0]
    assert "buckets" in problems[1]
    assert "no method 'train_from_datasets'" in problems[2]
    assert any(b.fragment is None for b in BLOCKS) and any(b.fragment for b in BLOCKS)


# -- the commands the docs show ----------------------------------------------------------

_INLINE = re.compile(r"`(sparseps [^`\n]*)`")
_SHELL = re.compile(r"^[ \t]*```(?:bash|sh|console)\n(.*?)^[ \t]*```", re.M | re.S)
_CALL = re.compile(r"^sparseps ([a-z][a-z-]*)(?=[\s`]|$)(.*)", re.S)
_FLAG = re.compile(r"(?<![\w-])--(\[no-\])?([a-z][a-z0-9-]*)")


def _documented_commands() -> list[tuple[str, str]]:
    """``(where, command line)`` of every ``sparseps COMMAND ...`` in inline code and in
    shell blocks (continuation lines joined)."""
    found = []
    for path in DOCS:
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        found += [(where, m.group(1)) for m in _INLINE.finditer(text)]
        for block in _SHELL.finditer(text):
            joined = block.group(1).replace("\\\n", " ")
            for line in joined.splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("sparseps "):
                    found.append((where, line.split("  #", 1)[0]))
    return found


def _options(command: str) -> set[str]:
    import argparse

    from sparseps.cli import COMMANDS

    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    return {s for action in parser._actions for s in action.option_strings} | {"--log-level"}


def _command_problems(commands: list[tuple[str, str]]) -> list[str]:
    from sparseps.cli import COMMANDS

    problems, options = [], {}
    for where, line in commands:
        call = _CALL.match(line)
        if call is None:
            continue  # an error message quoted in the docs ("sparseps launch: error: ...")
        name, rest = call.groups()
        if name not in COMMANDS:
            problems.append(f"{where}: `{line}`: no command {name!r}")
            continue
        known = options.setdefault(name, _options(name))
        rest = re.split(r"\S+\.py\b", rest, maxsplit=1)[0]  # a script's own options follow it
        for no, flag in _FLAG.findall(rest):
            for spelling in [f"--{flag}", *([f"--no-{flag}"] if no else [])]:
                if spelling not in known:
                    problems.append(f"{where}: `{line}`: {name} has no option {spelling}")
    return problems


def test_the_docs_commands_and_their_options_exist():
    commands = _documented_commands()
    assert len(commands) > 50 and {c.split()[1] for _, c in commands} >= {"launch", "serve"}
    problems = _command_problems(commands)
    assert not problems, "\n".join(problems)
    wrong = [("x.md", "sparseps lauch --server-num 1"), ("x.md", "sparseps serve DIR --prot 1"),
             ("x.md", "sparseps demo --[no-]progres"),
             ("x.md", "sparseps launch --server-nums 1 train.py --epochs 2")]  # fmt: skip
    assert len(_command_problems(wrong)) == 5  # each kind of mistake is caught (not --epochs)


def test_the_docs_environment_variables_are_the_ones_sparseps_reads():
    """Every ``SPARSEPS_*`` variable the docs name is one :mod:`sparseps.env` (the one
    reader of the environment) defines; the suite's own knobs aside."""
    from sparseps import env

    defined = {setting.name for setting in env.SETTINGS}
    suite_only = {"SPARSEPS_TEST_ARTIFACTS"}  # where a test keeps its screenshots
    named = {
        name
        for path in DOCS
        for name in re.findall(r"\bSPARSEPS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())
    }
    assert len(named) > 15
    assert named - defined - suite_only == set()
