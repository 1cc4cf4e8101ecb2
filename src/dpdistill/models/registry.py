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

CLASSIFIERS: dict[str, Callable[..., Classifier]] = {
    "cnn": ConvNet,
    "datalens": DataLensStudent,
    "resnet18": resnet18,
    "resnet34": resnet34,
}


class ForeignClassifier(Classifier):
    """Adapts a user's nn.Module: its last nn.Linear is the classifier, whatever feeds it is the features."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ConfigError("a user model needs a final nn.Linear layer (its input is used as the features)")
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
        return captured[-1].flatten(1)

    def classify(self, features: Tensor) -> Tensor:
        return self._head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x)


def _import_factory(spec: str) -> Callable[..., Any]:
    module_name, _, attribute = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"cannot import architecture {spec!r}: {error}") from error
    if not callable(factory):
        raise ConfigError(f"architecture {spec!r} is not callable")
    return factory


def build_classifier(arch: str, in_shape: tuple[int, int, int], num_classes: int, **options: Any) -> Classifier:
    """A fresh classifier; `arch` is a registered name or `module.path:callable` (called with in_shape, num_classes)."""
    in_shape = tuple(int(v) for v in in_shape)
    if ":" in arch:
        model = _import_factory(arch)(in_shape=in_shape, num_classes=num_classes, **options)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"architecture {arch!r} returned {type(model).__name__}, not a torch.nn.Module")
        if not isinstance(model, Classifier):
            model = ForeignClassifier(model)
        try:
            with torch.no_grad():
                logits = model(torch.zeros(2, *in_shape))
        except RuntimeError as error:
            raise ConfigError(f"architecture {arch!r} fails on inputs of shape {in_shape}: {error}") from error
        if tuple(logits.shape) != (2, num_classes):
            raise ConfigError(f"architecture {arch!r} gives outputs of shape {tuple(logits.shape)} for a batch of 2, "
                              f"expected (2, {num_classes})")
        return model
    if arch not in CLASSIFIERS:
        raise ConfigError(f"unknown architecture {arch!r}: choose one of {', '.join(CLASSIFIERS)} or module:callable")
    return CLASSIFIERS[arch](in_shape, num_classes, **options)


def build_generator(latent_dim: int, out_shape: tuple[int, int, int], width: tuple[int, int, int]) -> Generator:
    return Generator(latent_dim, tuple(int(v) for v in out_shape), tuple(int(v) for v in width))
