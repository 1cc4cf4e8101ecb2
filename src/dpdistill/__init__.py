"""dpdistill: turn a model trained on private data into a differentially private student and generator."""

from typing import Any

__version__ = "0.1.0"

from dpdistill import methods  # noqa: E402  callable: dpdistill.methods() lists every method (methods/__init__.py)

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
