"""The public front door: nothing private leaks, nothing public disappears."""

import importlib
import types

import sparseps

EXPECTED = {
    "CheckpointError", "ConfigError", "InputError", "ProtocolError", "RemoteError",
    "SparsePSError", "DeadlineError", "UnavailableError", "__version__", "errors",
    "Accessor", "Initializer", "Lifecycle", "TableConfig", "PSClient", "Strategy", "Trainer", "Predictor",
    "Mode", "Sync", "Async", "Geo", "GpuPS", "Heter", "Hybrid",
    "init", "is_heter_worker", "is_server", "is_worker", "worker_index", "worker_num", "server_num",
    "server_endpoints", "run_server", "barrier_worker", "stop", "all_reduce",
    "data", "metrics", "models", "nn", "online", "optim", "testing",
}  # fmt: skip


def test_all_is_exactly_the_public_api():
    assert set(sparseps.__all__) == EXPECTED


def test_every_public_name_resolves():
    for name in sparseps.__all__:
        assert getattr(sparseps, name) is not None, name


def test_no_private_name_in_all():
    assert not [n for n in sparseps.__all__ if n.startswith("_") and n != "__version__"]


def _leaks(module: types.ModuleType) -> list[str]:
    """Public-looking attributes of ``module`` that are neither in ``__all__`` nor one of
    its own submodules (``sparseps.rpc`` appears on ``sparseps`` once imported)."""
    public = set(module.__all__)
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and name not in public
        and not (
            isinstance(value, types.ModuleType) and value.__name__ == f"{module.__name__}.{name}"
        )
    )


def test_no_stray_attribute_leaks():
    # Resolve every lazy name first: that imports (and attaches) the submodules behind them.
    for name in sparseps.__all__:
        getattr(sparseps, name)
    assert _leaks(sparseps) == [], "import them as _name, or del them after use"


def test_leak_check_catches_a_stray_import():
    fake = types.ModuleType("sparseps_fake")
    exec(
        "import importlib, os.path as osp\nfrom math import pi\nimport json as _json\n"
        "__all__ = ['pi']\nhelper = lambda: 1\n",
        vars(fake),
    )
    fake.sub = types.ModuleType("sparseps_fake.sub")  # a submodule is not a leak
    fake.other = types.ModuleType("sparseps_other.sub")  # another package's module is
    assert _leaks(fake) == ["helper", "importlib", "osp", "other"]


def test_import_is_light():
    # importing the package must not start anything or pull in torch eagerly
    code = "import sys, sparseps; print('torch' in sys.modules)"
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_errors_pickle_with_their_fields():
    import pickle

    err = sparseps.DeadlineError("pull timed out", op="pull", role="server", rank=1,
                                 address="127.0.0.1:1", seconds=2.0, setting="timeout")  # fmt: skip
    back = pickle.loads(pickle.dumps(err))
    assert (back.op, back.rank, back.seconds, str(back)) == ("pull", 1, 2.0, "pull timed out")
    assert isinstance(back, TimeoutError)
    assert importlib.import_module("sparseps.errors").SparsePSError in type(back).__mro__


def test_timeout_error_alias_is_gone():
    # removed after its deprecation release (CHANGELOG.md): catch DeadlineError
    assert not hasattr(sparseps, "TimeoutError_")
    assert not hasattr(sparseps.errors, "TimeoutError_")


# sparseps.models is being edited by another change; its 8 unannotated parameters
# (the rules of DNN/DeepFM/WideDeep/TwoTower, TwoTower's batch arguments) are left to it.
UNANNOTATED_ELSEWHERE = {"sparseps.models"}
SUBPACKAGES = ("checkpoint", "core", "data", "files", "launch", "metrics", "nn", "online",
               "optim", "rpc", "server", "table", "testing", "worker")  # fmt: skip


def _public_callables():
    import inspect

    def members(owner, obj):
        if inspect.isfunction(obj):
            yield f"{owner}.{obj.__name__}", obj
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            # the class's own methods and those its sparseps bases give it (mixins such as
            # PSClient's: its calls live in one module per group)
            ours = [k for k in obj.__mro__ if k.__module__.startswith("sparseps")]
            for name in dict.fromkeys(n for k in ours for n in vars(k)):
                if name == "__init__" or not name.startswith("_"):
                    member = getattr(obj, name)
                    if inspect.isfunction(member) or inspect.ismethod(member):
                        yield f"{owner}.{obj.__name__}.{name}", member

    packages = [("sparseps", sparseps.__all__)]
    for sub in SUBPACKAGES:
        module = importlib.import_module(f"sparseps.{sub}")
        packages.append((f"sparseps.{sub}", getattr(module, "__all__", ())))
    for package, names in packages:
        module = importlib.import_module(package)
        for name in names:
            obj = getattr(module, name)
            if not isinstance(obj, types.ModuleType):
                yield from members(package, obj)


def test_the_public_surface_is_annotated():
    import inspect

    missing = {}
    for where, function in _public_callables():
        if any(getattr(function, "__module__", "").startswith(m) for m in UNANNOTATED_ELSEWHERE):
            continue
        signature = inspect.signature(function)
        bare = [p.name for p in signature.parameters.values()
                if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]  # fmt: skip
        if function.__name__ != "__init__" and signature.return_annotation is signature.empty:
            bare.append("return")
        if bare:
            missing[where] = bare
    assert not missing, missing
