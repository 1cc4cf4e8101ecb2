"""Classifiers trained outside dpdistill: a factory that builds the network, and safetensors weights with the
factory's own state_dict keys.

The factory is `path/to/file.py:callable` or `module.path:callable`, called with those of `in_shape` and
`num_classes` it accepts. A file is copied into the teacher's directory with the Python code beside it (its
folder's .py files, the folder above its outermost package's where it is in one, or those of a folder named with
`code`: models/code.py), and run from there on every load with that code importable (`from mynet import Net` at the
top of the file), so later commands work from any working directory and without PYTHONPATH. A `module:callable`
stays a reference: the module must be importable wherever the teacher is loaded (an installed package). Either way
the factory is code the user chose to run; the weights are never unpickled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpdistill.models.base import Classifier
from dpdistill.models.checkpoint import fit_weights, read_weights
from dpdistill.models.registry import ForeignClassifier, build_classifier
from dpdistill.models.transform import InputTransform, TransformedClassifier


def import_classifier(factory: str, weights: Path, in_shape: tuple[int, int, int], num_classes: int,
                      transform: dict[str, Any] | None) -> Classifier:
    """The factory's network with the weights loaded under their own keys (strictly: a missing, unexpected or
    misshapen key, or a NaN, is refused), behind the input transform, in eval mode."""
    model = build_classifier(factory, in_shape, num_classes)
    network = model.module if isinstance(model, ForeignClassifier) else model  # the keys the weights were saved with
    fit_weights(network, read_weights(weights), weights, f"the network {factory} builds (its state_dict keys)")
    if transform is not None:
        model = TransformedClassifier(model, InputTransform(transform, in_shape[0]))
    return model.eval()
