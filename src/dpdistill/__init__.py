"""dpdistill: turn a model trained on private data into a differentially private student and generator."""

from types import ModuleType
from typing import Any

__version__ = "0.1.0"

from dpdistill import methods  # noqa: E402


class _ListingPackage(ModuleType):
    """`dpdistill.methods()` lists every method (name, one-line description, what it needs, its paper, the command
    that runs it and its presets). A function of that name here would be replaced by the package `dpdistill.methods`
    as soon as it is imported, so the listing lives on the package itself; the methods are imported on the first
    call (they pull in PyTorch and Opacus)."""

    def __call__(self) -> list[dict[str, str]]:
        from dpdistill.registry import methods as registered

        return registered()


methods.__class__ = _ListingPackage

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
