"""Classifiers trained outside dpdistill: a factory that builds the network, and safetensors weights with the
factory's own state_dict keys.

The factory is `path/to/file.py:callable` or `module.path:callable`, called with those of `in_shape` and
`num_classes` it accepts. A file is copied into the teacher's directory (FACTORY_FILE) and run from there on every
load, so later commands work from any working directory and without PYTHONPATH; it must be self-contained (it may
import installed packages, not modules beside it). A `module:callable` stays a reference: the module must be
importable wherever the teacher is loaded. Either way the factory is code the user chose to run; the weights are
never unpickled.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dpdistill.models.base import Classifier
from dpdistill.models.checkpoint import fit_weights, read_weights
from dpdistill.models.registry import ForeignClassifier, build_classifier, is_factory_file
from dpdistill.models.transform import InputTransform, TransformedClassifier

FACTORY_FILE = "factory.py"


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


def keep_factory(factory: str, directory: Path) -> tuple[str, dict[str, Any]]:
    """(the `arch` to record, the `factory` entry of the description): a factory file is copied into `directory`,
    a module stays a reference."""
    location, _, name = factory.rpartition(":")
    if not is_factory_file(factory):
        (directory / FACTORY_FILE).unlink(missing_ok=True)  # an earlier import's, replaced by --overwrite
        return factory, {"reference": factory, "note": "imported by name: the module must be importable (installed "
                                                       "or on PYTHONPATH) wherever this teacher is loaded"}
    source = Path(location).expanduser().resolve()
    shutil.copyfile(source, directory / FACTORY_FILE)
    return f"{FACTORY_FILE}:{name}", {"file": FACTORY_FILE, "callable": name, "copied_from": str(source),
                                      "note": "Python code run on every load of this teacher"}
