"""Architectures by name, and user-supplied ones as `module.path:callable`."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch import Tensor, nn

from dpdistill.errors import ConfigError
from dpdistill.models.base import Classifier
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
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"architecture {spec!r} must read `module.path:callable`, e.g. `my_models:build_net`")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"cannot import architecture {spec!r} ({error}); check the module is on PYTHONPATH "
                          f"and defines {attribute!r}") from error
    if not callable(factory):
        raise ConfigError(f"architecture {spec!r} is a {type(factory).__name__}, not a callable returning a model")
    return factory


def _build_user_classifier(spec: str, in_shape: tuple[int, int, int], num_classes: int,
                           **options: Any) -> Classifier:
    """Build, adapt and smoke-test a user model, so a mistake fails here rather than mid-training."""
    factory = _import_factory(spec)
    try:
        model = factory(in_shape=in_shape, num_classes=num_classes, **options)
    except Exception as error:  # whatever user code raises, the fix is in their factory
        raise ConfigError(f"architecture {spec!r} failed when called as {spec.partition(':')[2]}"
                          f"(in_shape={in_shape}, num_classes={num_classes}): {error}") from error
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


def build_classifier(arch: str, in_shape: tuple[int, int, int], num_classes: int, **options: Any) -> Classifier:
    """A fresh classifier; `arch` is a registered name or `module.path:callable` (called with in_shape, num_classes)."""
    shape = tuple(int(v) for v in in_shape)
    if len(shape) != 3:
        raise ConfigError(f"input shape must be (channels, height, width), got {tuple(in_shape)}")
    if ":" in arch:
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


def build_generator(latent_dim: int, out_shape: tuple[int, int, int], width: tuple[int, int, int]) -> Generator:
    """A fresh generator; shapes are coerced to int tuples because they often come from JSON lists."""
    return Generator(int(latent_dim), tuple(int(v) for v in out_shape), tuple(int(v) for v in width))
