"""Architectures by name, and user-supplied ones as `module.path:callable` or `file.py:callable`."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor, nn

from dpdistill.errors import ConfigError
from dpdistill.models.base import Classifier
from dpdistill.models.code import code_beside, factory_code, is_factory_file
from dpdistill.models.classifiers import ConvNet, DataLensStudent, resnet18, resnet34
from dpdistill.models.generator import Generator
from dpdistill.models.scattering import ScatterCNN, ScatterLinear

CLASSIFIERS: dict[str, Callable[..., Classifier]] = {
    "cnn": ConvNet,
    "datalens": DataLensStudent,
    "resnet18": resnet18,
    "resnet34": resnet34,
    "scatter-cnn": ScatterCNN,
    "scatter-linear": ScatterLinear,
}


class ForeignClassifier(Classifier):
    """Adapts a user's nn.Module that has no features()/classify().

    Rule: the last nn.Linear in the module's registration order (`module.modules()`) is the classifier, and
    its flattened input is the features. forward(x) is the user's own forward; build_classifier checks that
    it equals classify(features(x)), i.e. that nothing (a softmax, say) follows that Linear.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ConfigError("a user model needs a final nn.Linear layer (its input is used as the features); "
                              "add one, or give the model features() and classify() methods")
        self.module = module
        # Not registered as a submodule: it already lives inside `module`, and a second name for the same
        # weights would make the checkpoint hold shared tensors.
        object.__setattr__(self, "_head", linears[-1])

    def features(self, x: Tensor) -> Tensor:
        captured: list[Tensor] = []
        handle = self._head.register_forward_pre_hook(lambda _m, inputs: captured.append(inputs[0]))
        try:
            self.module(x)
        finally:
            handle.remove()
        if not captured:
            raise ConfigError("the user model's last nn.Linear is never called by its forward(), so it cannot "
                              "be the classifier; make the output layer the last nn.Linear defined")
        return captured[-1].flatten(1)

    def classify(self, features: Tensor) -> Tensor:
        return self._head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x)


def _import_factory(spec: str) -> Callable[..., Any]:
    """The callable `spec` names: `module.path:callable` (imported by name, so the module must be importable) or
    `path/to/file.py:callable` (that file, run as a module of its own with the code beside it importable:
    models/code.py).

    Either way this runs Python code the user chose to run, as any `import` does: a factory file copied into a
    checkpoint directory by `dpdistill import-teacher` is run again on every load of that checkpoint. Weights are
    never unpickled: they come from safetensors files only."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"architecture {spec!r} must read `module.path:callable` or `file.py:callable`, e.g. "
                          f"`my_models:build_net`")
    try:
        module = _load_file(Path(module_name)) if is_factory_file(spec) else importlib.import_module(module_name)
        factory = getattr(module, attribute)
    except ConfigError:  # its code clashes with another model's (models/code.py)
        raise
    except Exception as error:  # importing runs the user's module: whatever it raises, the fix is there
        where = "the file exists" if is_factory_file(spec) else "the module is on PYTHONPATH"
        raise ConfigError(f"cannot import architecture {spec!r} ({error}); check {where} and defines "
                          f"{attribute!r}") from error
    if not callable(factory):
        raise ConfigError(f"architecture {spec!r} is a {type(factory).__name__}, not a callable returning a model")
    return factory


def _load_file(path: Path) -> ModuleType:
    """The module defined by the Python file `path`, under a name of its own (two teachers' factory files may
    share a file name), loaded again when the file changes."""
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise ImportError(f"no file {resolved}")
    name = "dpdistill_factory_" + hashlib.sha256(str(resolved).encode() + resolved.read_bytes()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as `import` does: dataclasses in the file look it up there
    try:
        with code_beside(resolved):
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _code_of(spec: str) -> ContextManager[None]:
    """What a factory file's code needs to run: the code beside it importable; nothing for a module."""
    return code_beside(Path(spec.rpartition(":")[0]).expanduser().resolve()) if is_factory_file(spec) \
        else contextlib.nullcontext()


def _factory_arguments(factory: Callable[..., Any], in_shape: tuple[int, int, int], num_classes: int
                      ) -> dict[str, Any]:
    """Those of `in_shape` and `num_classes` that the factory accepts by keyword (all of them if it takes
    **kwargs or hides its signature): models written elsewhere often take `num_classes` alone."""
    offered = {"in_shape": in_shape, "num_classes": num_classes}
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension callable: no signature to read
        return offered
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return offered
    accepted = {parameter.name for parameter in parameters if parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return {name: value for name, value in offered.items() if name in accepted}


def _build_user_classifier(spec: str, in_shape: tuple[int, int, int], num_classes: int,
                           **options: Any) -> Classifier:
    """Build, adapt and smoke-test a user model, so a mistake fails here rather than mid-training (or, for a
    factory file whose code is too large to keep beside the saved model, when it is saved)."""
    factory = _import_factory(spec)
    factory_code(spec)
    arguments = {**_factory_arguments(factory, in_shape, num_classes), **options}
    try:
        with _code_of(spec):  # a factory may import the modules beside it when called
            model = factory(**arguments)
    except ConfigError:
        raise
    except Exception as error:  # whatever user code raises, the fix is in their factory
        called = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
        raise ConfigError(f"architecture {spec!r} failed when called as {spec.rpartition(':')[2]}({called}): "
                          f"{error}") from error
    if not isinstance(model, nn.Module):
        raise ConfigError(f"architecture {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    if not isinstance(model, Classifier):
        model = ForeignClassifier(model)
    was_training = model.training
    model.eval()  # no BatchNorm statistics updated, no dropout: forward and classify(features) must agree
    try:
        with torch.no_grad():
            x = torch.zeros(2, *in_shape)
            logits, recomposed = model(x), model.classify(model.features(x))
    except (RuntimeError, TypeError, ValueError) as error:
        raise ConfigError(f"architecture {spec!r} fails on inputs of shape {in_shape}: {error}") from error
    finally:
        model.train(was_training)
    if tuple(logits.shape) != (2, num_classes):
        raise ConfigError(f"architecture {spec!r} gives outputs of shape {tuple(logits.shape)} for a batch of 2, "
                          f"expected (2, {num_classes}): its forward must return logits")
    if recomposed.shape != logits.shape or not torch.allclose(recomposed, logits, atol=1e-5):
        raise ConfigError(f"architecture {spec!r}: forward(x) differs from classify(features(x)); the last "
                          f"nn.Linear must produce the logits (no softmax or other layer after it)")
    return model


def is_user_arch(arch: str | None) -> bool:
    """Whether `arch` names a user's own model (`module.path:callable` or `file.py:callable`), not a registered one."""
    return arch is not None and ":" in arch


def build_classifier(arch: str, in_shape: tuple[int, int, int], num_classes: int, **options: Any) -> Classifier:
    """A fresh classifier; `arch` is a registered name, `module.path:callable` or `file.py:callable` (called with
    those of in_shape and num_classes it accepts)."""
    shape = tuple(int(v) for v in in_shape)
    if len(shape) != 3:
        raise ConfigError(f"input shape must be (channels, height, width), got {tuple(in_shape)}")
    if is_user_arch(arch):
        return _build_user_classifier(arch, shape, num_classes, **options)
    if arch not in CLASSIFIERS:
        raise ConfigError(f"unknown architecture {arch!r}: choose one of {', '.join(CLASSIFIERS)} "
                          f"or give your own as module.path:callable")
    try:
        return CLASSIFIERS[arch](shape, num_classes, **options)
    except TypeError as error:
        raise ConfigError(f"architecture {arch!r} does not accept options {sorted(options)}: {error}") from error


def has_fixed_backbone(arch: str) -> bool:
    """Whether the registered architecture's backbone is a fixed transform (no parameters); user models are not."""
    return getattr(CLASSIFIERS.get(arch), "fixed_backbone", False)


INITIALISATIONS = ("default", "xavier")


def initialise(model: nn.Module, scheme: str) -> nn.Module:
    """Re-initialise `model`'s convolutions and linear layers: "xavier" draws each weight Glorot-uniform and zeroes
    each bias (from torch's global generator, so a seeded run stays reproducible); "default" keeps PyTorch's
    per-layer initialisation."""
    if scheme == "xavier":
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
    elif scheme != "default":
        raise ConfigError(f"unknown initialisation {scheme!r}: choose {' or '.join(INITIALISATIONS)}")
    return model


def build_generator(latent_dim: int, out_shape: tuple[int, int, int], width: tuple[int, int, int],
                    final_norm: bool = False) -> Generator:
    """A fresh generator; shapes are coerced to int tuples because they often come from JSON lists."""
    return Generator(int(latent_dim), tuple(int(v) for v in out_shape), tuple(int(v) for v in width), final_norm)
