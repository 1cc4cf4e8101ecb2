"""Classifiers trained outside dpdistill: a factory that builds the network, and safetensors weights with the
factory's own state_dict keys.

The factory is `path/to/file.py:callable` or `module.path:callable`, called with those of `in_shape` and
`num_classes` it accepts. A file is copied into the teacher's directory with the Python code beside it (its
folder's .py files, or those of a folder named with `code`: CODE_DIR), and run from there on every load with that
code importable (`from mynet import Net` at the top of the file), so later commands work from any working directory
and without PYTHONPATH. A `module:callable` stays a reference: the module must be importable wherever the teacher
is loaded (an installed package). Either way the factory is code the user chose to run; the weights are never
unpickled.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpdistill.errors import ConfigError
from dpdistill.models.base import Classifier
from dpdistill.models.checkpoint import fit_weights, read_weights
from dpdistill.models.registry import ForeignClassifier, build_classifier, is_factory_file
from dpdistill.models.transform import InputTransform, TransformedClassifier

CODE_DIR = "code"  # in a teacher's directory: its factory file and the code beside it
MAX_CODE_FILES, MAX_CODE_BYTES = 500, 20 * 10**6


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


@dataclass(frozen=True)
class FactoryCode:
    """What an import keeps of a factory: the file, the folder of code it lives in, and that folder's .py files."""

    source: Path
    root: Path
    files: list[Path]
    name: str  # the callable


def factory_code(factory: str, code: Path | None = None) -> FactoryCode | None:
    """The code a factory file brings (its own folder's, or `code`'s), checked before anything is written; None
    for a module, which stays a reference."""
    if not is_factory_file(factory):
        return None
    location, _, name = factory.rpartition(":")
    source = Path(location).expanduser().resolve()
    root = (code or source.parent).expanduser().resolve()
    return FactoryCode(source, root, code_files(source, root), name)


def keep_factory(factory: str, kept: FactoryCode | None, directory: Path) -> tuple[str, dict[str, Any]]:
    """(the `arch` to record, the `factory` entry of the description): a factory file is copied into `directory`
    with the code beside it (CODE_DIR), a module stays a reference."""
    shutil.rmtree(directory / CODE_DIR, ignore_errors=True)  # an earlier import's, replaced by --overwrite
    if kept is None:
        return factory, {"reference": factory, "note": "imported by name: the module must be importable (installed "
                                                       "or on PYTHONPATH) wherever this teacher is loaded"}
    for file in kept.files:
        target = directory / CODE_DIR / file.relative_to(kept.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
    path = f"{CODE_DIR}/{kept.source.relative_to(kept.root).as_posix()}"
    return f"{path}:{kept.name}", {"file": path, "callable": kept.name, "copied_from": str(kept.source),
                                   "code": str(kept.root), "code_files": len(kept.files),
                                   "note": "Python code run on every load of this teacher"}


def code_files(factory: Path, root: Path) -> list[Path]:
    """The .py files under `root` (hidden folders and caches aside) that go with the factory file, refused where
    the folder is not the model's code: the factory outside it, or more than MAX_CODE_FILES / MAX_CODE_BYTES."""
    if not root.is_dir():
        raise ConfigError(f"--code {root} is not a folder")
    if not factory.is_relative_to(root):
        raise ConfigError(f"the factory file {factory} is not inside --code {root}: name the folder that holds it")
    files = [path for path in sorted(root.rglob("*.py"))
             if not any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(root).parts)]
    size = sum(path.stat().st_size for path in files)
    if len(files) > MAX_CODE_FILES or size > MAX_CODE_BYTES:
        raise ConfigError(f"{root} holds {len(files)} Python files ({size / 1e6:.1f} MB), more than a model's code "
                          f"(at most {MAX_CODE_FILES} files, {MAX_CODE_BYTES // 10**6} MB): put the model's code in a "
                          f"folder of its own and name it with --code, or install it as a package and give "
                          f"module:callable")
    return files
