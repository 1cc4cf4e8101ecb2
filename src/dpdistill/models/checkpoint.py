"""Checkpoints as safetensors (weights) + JSON (what they are): no pickle, so loading a file runs no code.

A directory holds `<name>.safetensors` and `<name>.json`; a teacher directory also holds `meta.json`, the
same description under the name the product documents.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.models.base import Classifier
from dpdistill.models.generator import Generator
from dpdistill.models.registry import build_classifier, build_generator


def _write_atomically(path: Path, write: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    write(temporary)
    os.replace(temporary, path)


def save_model(directory: Path, model: nn.Module, meta: dict[str, Any], name: str = "model") -> None:
    """Write weights and description; an interrupted save never leaves a half-written file in place."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {key: value.detach().cpu().contiguous() for key, value in model.state_dict().items()}
    _write_atomically(directory / f"{name}.safetensors",
                      lambda path: save_file(tensors, path, metadata={"format": "dpdistill", "kind": meta["kind"]}))
    text = json.dumps(meta, indent=2)
    names = [f"{name}.json"] + (["meta.json"] if name == "model" else [])
    for file_name in names:
        _write_atomically(directory / file_name, lambda path: path.write_text(text))


def _read_meta(directory: Path, name: str) -> dict[str, Any]:
    if not (directory / f"{name}.safetensors").exists():
        hint = " train one with `dpdistill train-teacher`" if name == "model" else ""
        raise CheckpointError(f"no model at {directory}: expected {directory / (name + '.safetensors')} and its "
                              f"JSON description;{hint}")
    for candidate in (directory / f"{name}.json", directory / "meta.json"):
        if candidate.exists():
            try:
                meta = json.loads(candidate.read_text())
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{candidate} is not valid JSON ({error})") from error
            if not isinstance(meta, dict) or "kind" not in meta:
                raise CheckpointError(f"{candidate} does not describe a dpdistill model (no 'kind')")
            return meta
    raise CheckpointError(f"{directory} has {name}.safetensors but no {name}.json or meta.json describing it")


def _load_weights(directory: Path, name: str, model: nn.Module, arch: str) -> None:
    path = directory / f"{name}.safetensors"
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file ({error})") from error
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = sorted(k for k in set(expected) & set(tensors) if expected[k].shape != tensors[k].shape)
    if missing or unexpected or mismatched:
        raise CheckpointError(
            f"{path} does not fit architecture {arch!r} (a foreign or corrupt checkpoint): "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}, wrong shape {mismatched[:3]}"
        )
    model.load_state_dict(tensors)


def load_classifier(directory: Path, name: str = "model") -> tuple[Classifier, dict[str, Any]]:
    """A saved classifier in eval mode, with its description."""
    meta = _read_meta(directory, name)
    if meta["kind"] != "classifier":
        raise CheckpointError(f"{directory / name} is a {meta['kind']}, not a classifier")
    try:
        model = build_classifier(meta["arch"], tuple(meta["in_shape"]), int(meta["num_classes"]),
                                 **meta.get("arch_options", {}))
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{directory / name}.json lacks or garbles a field ({error})") from error
    except ConfigError as error:
        raise CheckpointError(f"{directory / name}: {error}") from error
    _load_weights(directory, name, model, meta["arch"])
    return model.eval(), meta


def load_generator(directory: Path, name: str = "generator") -> tuple[Generator, dict[str, Any]]:
    """A saved generator in eval mode, with its description."""
    meta = _read_meta(directory, name)
    if meta["kind"] != "generator":
        raise CheckpointError(f"{directory / name} is a {meta['kind']}, not a generator")
    try:
        model = build_generator(int(meta["latent_dim"]), tuple(meta["out_shape"]), tuple(meta["width"]))
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{directory / name}.json lacks or garbles a field ({error})") from error
    _load_weights(directory, name, model, "generator")
    return model.eval(), meta
