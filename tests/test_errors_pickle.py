"""Every exception of sparseps pickles (STYLE.md: "Exceptions pickle"): an error raised in a
worker process, a Ray actor or a thread pool reaches the caller whole, type and fields.

Each subclass of :class:`sparseps.errors.SparsePSError` defined anywhere in the package
(every module imported first) is built from an example and round-tripped through pickle;
a class whose constructor needs more than a message has its example in ``EXAMPLES``: a new
such class fails here until it gets one.
"""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import sparseps
from sparseps.errors import SparsePSError

# Classes whose constructor takes more than a message: qualified name -> example arguments.
EXAMPLES: dict[str, tuple] = {
    "sparseps.serving.requests.RequestError": (413, "more than 10000 rows"),
}


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def _every_error_class() -> list[type]:
    for module in pkgutil.walk_packages(sparseps.__path__, "sparseps."):
        if not module.name.endswith(".__main__"):  # entry points: they run when imported
            importlib.import_module(module.name)
    classes = _subclasses(SparsePSError) | {SparsePSError}
    return sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


ERRORS = _every_error_class()


def test_the_package_defines_errors_outside_errors_py():
    # the walk reaches subpackages: a broken walk would leave only sparseps.errors
    modules = {cls.__module__ for cls in ERRORS}
    assert "sparseps.errors" in modules and len(modules) >= 5, modules


@pytest.mark.parametrize("cls", ERRORS, ids=_name)
def test_error_pickles_with_its_type_message_and_fields(cls):
    args = EXAMPLES.get(_name(cls), ("the message",))
    try:
        error = cls(*args)
    except TypeError as exc:
        pytest.fail(f"{_name(cls)}({args}) failed ({exc}): add an example to EXAMPLES")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == str(error)
    assert vars(back) == vars(error)
    assert back.args == error.args
