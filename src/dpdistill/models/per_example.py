"""A model made trainable with per-example gradients (DP-SGD through Opacus), as a user of Opacus expects from
ModuleValidator.fix: BatchNorm (which mixes the examples of a batch) becomes GroupNorm, and any other layer Opacus'
validators name is replaced as they say; in-place activations compute out of place (Opacus' hooks see each layer's
output, which an in-place activation would overwrite). Each kind of change is said in one line; a layer that cannot
be made so is refused in one line naming it. A model saved after DP-SGD is rebuilt through the same function on
load (models/checkpoint.py), so its layers are the ones it was trained with.

Such a model computes in the standard memory order, not channels-last (models/base.py): Opacus computes per-example
gradients fastest so, and PyTorch's GroupNorm on CPU runs about twenty times slower on channels-last maps (a
GroupNorm(32, 32) on 256 maps of 28 x 28: 62 ms against 3.3), which made every read of a loaded DP-SGD cnn teacher
slow.

Opacus is imported only here, and only when a model is made so: importing it takes seconds.
"""

from __future__ import annotations

from collections import defaultdict

from torch import nn

from dpdistill.errors import ConfigError
from dpdistill.models.base import use_channels_last
from dpdistill.models.registry import ForeignClassifier


def per_example(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """The model ready for per-example gradients, in the standard memory order (changed in place, or a fixed copy),
    and one line per kind of change; a layer no fix makes ready is refused, named."""
    from opacus.validators import ModuleValidator

    model = use_channels_last(model, False)
    before = dict(model.named_modules())
    fixed = ModuleValidator.fix(model) if _validation_errors(model) else model
    names = layer_names(fixed)
    replaced: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, layer in fixed.named_modules():
        if name in before and type(before[name]) is not type(layer):
            replaced[(type(before[name]).__name__, _described(layer))].append(names[layer])
    changes = [f"{old} -> {new} at {', '.join(layers)} (Opacus' ModuleValidator.fix: per-example gradients need "
               f"layers that treat each example alone)" for (old, new), layers in replaced.items()]
    in_place: dict[str, list[str]] = defaultdict(list)
    for layer, name in names.items():
        if getattr(layer, "inplace", None) is True:
            layer.inplace = False
            in_place[type(layer).__name__].append(name)
    changes += [f"{kind}(inplace=True) -> {kind}(inplace=False) at {', '.join(layers)} (Opacus' hooks keep each "
                f"layer's output, which an in-place activation overwrites)" for kind, layers in in_place.items()]
    errors = _validation_errors(fixed)
    if errors:
        layer, error = errors[0]
        raise ConfigError(f"DP-SGD cannot train the layer {names[layer]} ({type(layer).__name__}) of the student, "
                          f"even after Opacus' ModuleValidator.fix: {first_line(error)}; replace it in the model")
    return fixed, changes


def layer_names(model: nn.Module) -> dict[nn.Module, str]:
    """Each layer by the name its user knows it by: a user's network wrapped by dpdistill (ForeignClassifier) by its
    own names, without the wrapper's prefix."""
    network = model.module if isinstance(model, ForeignClassifier) else model
    return {**{layer: name or "the model" for name, layer in model.named_modules()},
            **{layer: name or "the model" for name, layer in network.named_modules()}}


def _validation_errors(model: nn.Module) -> list[tuple[nn.Module, Exception]]:
    """What Opacus refuses in `model`, by layer: its validators' errors (BatchNorm, LSTM, ...) and a trainable layer
    holding buffers (statistics that no noise covers)."""
    from opacus.utils.module_utils import trainable_modules
    from opacus.validators import ModuleValidator

    errors = []
    for _, layer in trainable_modules(model):
        validator = ModuleValidator.VALIDATORS.get(type(layer))
        errors += [(layer, error) for error in (validator(layer) if validator else [])]
        buffers = [buffer for buffer, _ in layer.named_buffers()]
        if buffers:
            errors.append((layer, ValueError(
                f"it holds buffers ({', '.join(buffers)}) beside its trainable weights, which Opacus does not support "
                f"(a buffer updated from the data would escape the noise)")))
    return errors


def _described(layer: nn.Module) -> str:
    """A replacement layer as the change's line names it: GroupNorm with its groups, others by type."""
    if isinstance(layer, nn.GroupNorm):
        return f"GroupNorm({layer.num_groups} groups)"
    return type(layer).__name__


def first_line(error: Exception) -> str:
    """An error's first line: libraries' messages run to paragraphs, a refusal is one line."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
