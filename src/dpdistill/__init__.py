"""dpdistill: turn a model trained on private data into a differentially private student and generator."""

__version__ = "0.1.0"
