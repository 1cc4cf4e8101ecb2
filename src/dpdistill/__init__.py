"""dpdistill: turn a model trained on private data into a differentially private student and generator."""

__version__ = "0.1.0"

from dpdistill import methods  # noqa: E402  callable: dpdistill.methods() lists every method (methods/__init__.py)

__all__ = ["__version__", "methods"]
