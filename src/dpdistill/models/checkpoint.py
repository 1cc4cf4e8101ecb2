"""Checkpoints as safetensors (weights) + JSON (what they are): no pickle, so loading a file runs no code.

A directory holds `<name>.safetensors` and `<name>.json`; a teacher directory (name "model") also holds
`meta.json`, the same description under the name the product documents.

The JSON description ("meta") holds `kind` ("classifier", "encoder", "head-ensemble" or "generator") and what
rebuilds the model: `arch`, `arch_options`, `in_shape`, `num_classes` for a classifier or an encoder (`arch`
may be a user's `module.path:callable`, re-imported on load) and `class_names` (each label's name, public as
`num_classes` is; models saved before it have none), plus `members` and `feature_dim` for a head
ensemble (its encoder's description, with M linear heads); `latent_dim`, `out_shape`, `width` for a generator. Callers add
provenance (`dataset`, `normalisation`, `dpdistill_version`), stored as given. A classifier trained with Opacus
whose layers had to be made per-example (BatchNorm -> GroupNorm, in-place activations out of place:
models/per_example.py) carries `opacus_fixed: true`, and is rebuilt so.
A model whose `arch` is a factory file (`file.py:callable`) carries `factory` (`file`: its factory's source, copied
into the directory with the code beside it, models/code.py, and run again on load, and `callable`); one brought in
by `dpdistill import-teacher` may instead carry a `reference` (a `module:callable` imported by name), and carries its
`input_transform` (models/transform.py). A model started from a pretrained encoder carries `init` (the encoder's
directory), `pretrained_on` and `public_pool` (the encoder's public images, data/public.py PoolSource); a PATE
student, the `public_pool` it learnt from. Weights holding NaN or infinite values are refused on every load. A DP
release's description carries `provenance` (privacy/provenance.py), bound to the SHA-256 of the weights' bytes,
which save_model serialises in memory before writing both files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.models.base import Classifier
from dpdistill.models.code import factory_code, is_factory_file, keep_factory
from dpdistill.models.generator import Generator
from dpdistill.models.per_example import per_example
from dpdistill.models.registry import build_classifier, build_generator
from dpdistill.models.transform import InputTransform, TransformedClassifier

if TYPE_CHECKING:  # the accounting it imports takes a second: only a DP release's save needs it, from its caller
    from dpdistill.privacy.provenance import Provenance

TEACHER = "model"
CLASS_NAMES = "class_names"  # a description's names of the classes, by label
STUDENT = "student"  # what transcribe, pate and train-private write: student.safetensors + student.json
ENCODER = "encoder"  # a pretrained starting point (`dpdistill pretrain`): encoder.safetensors + encoder.json
MAKERS = {TEACHER: ("teacher", "train one with `dpdistill train-teacher`, or give the directory of a run that released "
                              "a student (student.safetensors)"),
          ENCODER: ("encoder", "pretrain one on public images with `dpdistill pretrain`")}  # for a missing checkpoint


def _meta_names(name: str) -> list[str]:
    return [f"{name}.json", "meta.json"] if name == TEACHER else [f"{name}.json"]


def save_model(directory: Path, model: nn.Module, meta: dict[str, Any], name: str = TEACHER,
               provenance: Provenance | None = None) -> None:
    """Write `<name>.safetensors` and its JSON description (see the module docstring for the meta keys), and the
    code of a user's factory file beside them; with `provenance` (a DP release's), the description carries it, bound
    to these weights' digest."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = _with_code_kept(directory, meta)
    tensors = {key: value.detach().cpu().contiguous() for key, value in model.state_dict().items()}
    # One header entry: safetensors writes its metadata map in hash order, so two entries would make the bytes of
    # identical saves differ from run to run.
    weights = save(tensors, metadata={"dpdistill_kind": str(meta["kind"])})
    if provenance is not None:
        meta = provenance.describing(meta, weights)
    text = json.dumps(meta, indent=2)
    writers: dict[Path, Callable[[Path], None]] = {
        directory / f"{name}.safetensors": lambda path: path.write_bytes(weights)}
    for file_name in _meta_names(name):
        writers[directory / file_name] = lambda path: path.write_text(text)
    write_atomically(writers)


def description_path(directory: Path, name: str) -> Path:
    """The file that describes the saved model `name` in `directory` (the first of its names that exists)."""
    names = _meta_names(name)
    return next((directory / file_name for file_name in names if (directory / file_name).exists()),
                directory / names[-1])


def _with_code_kept(directory: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The description of a model built by a factory file, its code copied into `directory` (CODE_DIR) and `arch`
    pointing there, so the model loads without the folder it was built from; other descriptions as they are."""
    arch = meta.get("arch")
    if not isinstance(arch, str) or not is_factory_file(arch) or "factory" in meta:
        return meta
    arch, factory = keep_factory(arch, factory_code(arch), directory)
    return {**meta, "arch": arch, "factory": factory}


def read_meta(directory: Path, name: str) -> dict[str, Any]:
    """The JSON description of the saved model `name` in `directory` (refused when weights or description lack)."""
    weights = directory / f"{name}.safetensors"
    if not weights.exists():
        what, make = MAKERS.get(name, (name, "run `dpdistill transcribe` to make one"))
        expected = " and ".join(str(directory / file_name) for file_name in [weights.name, _meta_names(name)[-1]])
        raise CheckpointError(f"no {what} at {directory}: expected {expected}; {make}")
    candidate = description_path(directory, name)
    if not candidate.exists():
        raise CheckpointError(f"{directory} has {weights.name} but no {' or '.join(_meta_names(name))} describing "
                              f"it; copy the description file along with the weights, or save the model again")
    try:
        meta = json.loads(candidate.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{candidate} is not valid JSON ({error}); restore it or save the model again") from error
    if not isinstance(meta, dict) or "kind" not in meta:
        raise CheckpointError(f"{candidate} does not describe a dpdistill model (no 'kind' field)")
    return meta


def saved_class_names(meta: dict[str, Any]) -> tuple[str, ...] | None:
    """The class names a model's description holds, by label; None where it holds none (saved before they were
    kept)."""
    names = meta.get(CLASS_NAMES)
    if names is None:
        return None
    if not isinstance(names, list) or len(names) != meta.get("num_classes") or not all(
            isinstance(name, str) for name in names):
        raise CheckpointError(f"the description of a {meta['kind']} holds class_names that are not one string a "
                              f"class ({names!r:.80}); restore it or save the model again")
    return tuple(names)


def _check_kind(meta: dict[str, Any], kind: str, directory: Path, name: str) -> None:
    if meta["kind"] != kind:
        raise CheckpointError(f"{directory / name}.safetensors holds {_article(meta['kind'])}, not {_article(kind)}; "
                              f"point to the directory or name of {_article(kind)}")


def _article(noun: Any) -> str:
    return f"{'an' if str(noun)[:1] in 'aeiou' else 'a'} {noun}"


def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file (never a pickle: reading it runs no code)."""
    if not path.is_file():
        raise CheckpointError(f"no weights file at {path}")
    try:
        return load_file(path)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file ({error}): it is corrupt or truncated, "
                              f"or in another format (dpdistill reads safetensors only, never a pickle: save the "
                              f"state_dict with safetensors.torch.save_file); save the model again") from error


def fit_weights(model: nn.Module, tensors: dict[str, Tensor], path: Path, misfit: str) -> None:
    """Load `tensors` into `model` under their own keys, refusing in one line a set of keys or shapes that is not
    the model's (`misfit` says what the file should have fitted) and any NaN or infinite value: such a model
    answers at chance, and a release from it would spend privacy budget for nothing."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = sorted(k for k in set(expected) & set(tensors) if expected[k].shape != tensors[k].shape)
    if missing or unexpected or mismatched:
        raise CheckpointError(f"{path} does not fit {misfit}: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                              f"wrong shape {mismatched[:3]} ({len(missing)}, {len(unexpected)} and "
                              f"{len(mismatched)} in all)")
    broken = sorted(key for key, tensor in tensors.items()
                    if tensor.is_floating_point() and not torch.isfinite(tensor).all())
    if broken:
        raise CheckpointError(f"{path} holds NaN or infinite values in {len(broken)} tensor(s), e.g. {broken[:3]}: "
                              f"the model diverged or the file is damaged; train or export it again")
    model.load_state_dict(tensors)


def _load_weights(directory: Path, name: str, model: nn.Module, arch: str) -> None:
    path = directory / f"{name}.safetensors"
    fit_weights(model, read_weights(path), path, f"architecture {arch!r} named in its description (a foreign "
                                                  f"checkpoint, or weights and description from different models)")


def _build(directory: Path, name: str, build: Callable[[], nn.Module]) -> Any:
    """Rebuild the architecture a description names; a bad description is the checkpoint's fault."""
    try:
        return build()
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"the description of {directory / name}.safetensors lacks or garbles a field "
                              f"({error!r})") from error
    except ConfigError as error:
        raise CheckpointError(f"the description of {directory / name}.safetensors names a model that cannot be "
                              f"built: {error}") from error


def load_module(directory: Path, name: str, kind: str, build: Callable[[dict[str, Any]], nn.Module]
                ) -> tuple[Any, dict[str, Any]]:
    """The saved `kind` model `name` in eval mode, rebuilt by `build(meta)` and refused unless its weights fit."""
    meta = read_meta(directory, name)
    _check_kind(meta, kind, directory, name)
    model = _build(directory, name, lambda: build(_with_local_factory(meta, directory)))
    _load_weights(directory, name, model, str(meta.get("arch", kind)))
    return model.eval(), meta


def load_classifier(directory: Path, name: str = TEACHER, kind: str = "classifier"
                    ) -> tuple[Classifier, dict[str, Any]]:
    """A saved classifier in eval mode, with its description; `kind` "encoder" for a pretrained starting point
    (a classifier whose head was never trained, which commands that want a trained model refuse)."""
    return load_module(directory, name, kind, rebuild_classifier)


def _with_local_factory(meta: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The description with `arch` pointing at the factory file kept beside the weights, if there is one, so the
    model loads from any working directory and without PYTHONPATH."""
    factory = meta.get("factory") or {}
    if not factory.get("file"):
        return meta
    return {**meta, "arch": f"{directory / factory['file']}:{factory['callable']}"}


def rebuild_classifier(meta: dict[str, Any]) -> Classifier:
    """The untrained classifier a description names (made per-example for Opacus where it was trained so, and
    given the input transform it was imported with)."""
    in_shape = tuple(meta["in_shape"])
    model = build_classifier(meta["arch"], in_shape, int(meta["num_classes"]), **meta.get("arch_options", {}))
    if meta.get("input_transform"):
        model = TransformedClassifier(model, InputTransform(meta["input_transform"], int(in_shape[0])))
    if meta.get("opacus_fixed"):
        model, _ = per_example(model)
    return model


def load_generator(directory: Path, name: str = "generator") -> tuple[Generator, dict[str, Any]]:
    """A saved generator in eval mode, with its description."""
    return load_module(directory, name, "generator", lambda meta: build_generator(
        meta["latent_dim"], tuple(meta["out_shape"]), tuple(meta["width"])))


def load_conditional_generator(directory: Path, name: str = "generator") -> tuple[nn.Module, dict[str, Any]]:
    """A saved class-conditional generator (`dpdistill synthesize`) in eval mode, with its description:
    generator(latents uniform in [-1, 1], class indices) -> images in [-1, 1]."""
    from dpdistill.models.datalens import ConditionalGenerator

    return load_module(directory, name, "conditional-generator", lambda meta: ConditionalGenerator(
        meta["latent_dim"], meta["num_classes"], tuple(meta["out_shape"]), meta["hidden"], meta["width"]))
