"""dpdistill: turn a model trained on private data into a differentially private student and generator."""

from types import ModuleType
from typing import Any

__version__ = "0.1.0"

from dpdistill import federated, methods  # noqa: E402


class _CallablePackage(ModuleType):
    """A subpackage whose name is also a function of the package: `dpdistill.methods()` lists every method (name,
    one-line description, what it needs, its paper, the command that runs it and its presets), and
    `dpdistill.federated(...)` is the Python API's federated run. A function of that name here would be replaced
    by the subpackage as soon as it is imported, so the call lives on the subpackage itself; what it calls is
    imported on the first call (it pulls in PyTorch and Opacus)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from dpdistill import api, registry

        return {"dpdistill.methods": registry.methods, "dpdistill.federated": api.federated}[self.__name__](
            *args, **kwargs)


methods.__class__ = federated.__class__ = _CallablePackage

# The Python API (dpdistill/api.py), imported on first use: `import dpdistill` and the command line stay light.
_API = ("ModelResult", "ReleaseResult", "Result", "StudentResult", "SyntheticResult", "audit", "dgd", "evaluate",
        "federated", "import_teacher", "load_model", "pate", "pretrain", "release", "synthesize", "train_private",
        "train_teacher", "transcribe")

__all__ = ["__version__", "methods", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from dpdistill import api

        return getattr(api, name)
    raise AttributeError(f"module 'dpdistill' has no attribute {name!r}")
