"""Teachers, students and generators: architectures by name, and safetensors + JSON checkpoints."""

from dpdistill.models.base import Classifier, count_parameters
from dpdistill.models.checkpoint import load_classifier, load_generator, save_model
from dpdistill.models.generator import Generator
from dpdistill.models.registry import CLASSIFIERS, ForeignClassifier, build_classifier, build_generator

__all__ = [
    "CLASSIFIERS", "Classifier", "ForeignClassifier", "Generator", "build_classifier", "build_generator",
    "count_parameters", "load_classifier", "load_generator", "save_model",
]
