"""A DP picture of the data for a generator: one Gaussian release of the per-channel mean and second moment of the
inputs of a released model's normalisation layers over the private training set. BatchNorm keeps exactly these as
running statistics, and matching them is what lets the data-free engine draw images like the data (DeepInversion,
DP-DFD); a DP-SGD model normalises each example on its own (GroupNorm) and keeps none, so they are released here.

1. Per example: for each GroupNorm or BatchNorm layer of the model, the spatial mean of each channel of its input
   and of that input squared, concatenated over the layers and clipped to L2 norm `clip` (CLIP, chosen on the MNIST
   set: above the 99th percentile of the norms its DP teacher gives, so clipping leaves nearly every example as
   it is; benchmarks/experiments/released_statistics.py).
2. Release: their sum over the private training set plus Gaussian noise of std `noise_multiplier * clip` on every
   coordinate. One example added or removed moves the sum by at most `clip` in L2 (replaced: 2 `clip`), so it is one
   Gaussian mechanism of that multiplier (half of it under replace-one), accounted by dp-accounting.
3. Post-processing: the noisy sums over the public training-set size give each channel's mean and second moment;
   the variance is their difference, at least 0.

The model read here is itself a DP release (the teacher), public once released, so it is fixed before this release
reads the data, and the two compose adaptively: a release states the composition of both as its epsilon
(methods/release.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.privacy.accounting import (ADD_REMOVE, REPLACE_ONE, GaussianQuery, calibrate, composed_epsilon,
                                          epsilon_key)
from dpdistill.privacy.ledger import Release
from dpdistill.privacy.randomness import NoiseSource
from dpdistill.progress import Progress

STATISTICS_FILE = "statistics.safetensors"  # beside the model they were released for
STATISTICS_METHOD = "release: feature statistics"  # their entry in that model's ledger
CLIP = 20.0  # per-example L2 bound of the moments (module docstring, step 1)
BATCH = 1000  # private images through the model at once
PHASE = "released statistics"  # the progress display's name
Statistics = dict[str, tuple[Tensor, Tensor]]  # layer name -> (per-channel mean, per-channel variance)


@dataclass(frozen=True)
class StatisticsPlan:
    """The one release, fixed before the data are read: noise of std `multiplier * clip` on the moments' sum, where
    one example added or removed moves it by at most `clip` (replaced: 2 `clip`)."""

    multiplier: float  # noise std over the add-remove sensitivity `clip`
    delta: float
    clip: float = CLIP

    @classmethod
    def of_figures(cls, figures: dict[str, Any]) -> "StatisticsPlan":
        """The plan a statistics file's `figures` describe."""
        return cls(float(figures["noise_multiplier"]), float(figures["delta"]), float(figures["clip"]))

    def query(self, relation: str) -> GaussianQuery:
        """The release as a Gaussian mechanism under `relation`: its multiplier is the std over that sensitivity."""
        return GaussianQuery(self.multiplier / _sensitivity(relation))

    def epsilon(self, relation: str) -> float:
        return composed_epsilon(self.query(relation), 1, self.delta)

    def release(self, relation: str) -> Release:
        """What a ledger records, under `relation`."""
        return Release.of_query(self.query(relation), 1, self.delta)

    def figures(self) -> dict[str, Any]:
        """The release's public description, kept in the statistics file and stated in reports."""
        return {**{epsilon_key(relation): self.epsilon(relation) for relation in (ADD_REMOVE, REPLACE_ONE)},
                "delta": self.delta, "noise_multiplier": self.multiplier, "clip": self.clip,
                "accountant": "dp-accounting (one Gaussian mechanism)"}


def plan_statistics(epsilon: float, delta: float, relation: str) -> StatisticsPlan:
    """The least noise whose release stays within (epsilon, delta) under `relation`."""
    query = calibrate(GaussianQuery, 1, epsilon, delta)
    return StatisticsPlan(query.noise_multiplier * _sensitivity(relation), delta)


def _sensitivity(relation: str) -> int:
    """The moments' sum moves by this many times `clip` when one example changes under `relation`."""
    return 2 if relation == REPLACE_ONE else 1


def normalisation_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers whose inputs' statistics are released and matched, by name: GroupNorm and BatchNorm2d."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, (nn.GroupNorm, nn.BatchNorm2d))}


def _channels(layer: nn.Module) -> int:
    return layer.num_channels if isinstance(layer, nn.GroupNorm) else layer.num_features


def statistic_layers(model: nn.Module, name: str = "the model", way_out: str = "") -> dict[str, nn.Module]:
    """`normalisation_layers`, refused in one line where there are none (`name` and `way_out`: the message's)."""
    layers = normalisation_layers(model)
    if not layers:
        raise ConfigError(f"{name} has no GroupNorm or BatchNorm layer whose inputs' statistics could be released"
                          f"{way_out}")
    return layers


def per_example_moments(model: nn.Module, images: Tensor, clip: float) -> Tensor:
    """(n, D): each example's per-channel means of every layer's input and of its square, clipped to norm `clip`."""
    layers = statistic_layers(model)
    captured: dict[str, Tensor] = {}

    def keep(name: str):  # by name: the concatenation follows normalisation_layers' order, not the forward's
        return lambda _module, inputs, _output: captured.__setitem__(name, inputs[0])

    handles = [layer.register_forward_hook(keep(name)) for name, layer in layers.items()]
    try:
        model(images)
    finally:
        for handle in handles:
            handle.remove()
    moments = torch.cat([torch.cat([captured[name].mean((2, 3)), captured[name].pow(2).mean((2, 3))], 1)
                         for name in layers], 1)
    return moments * (clip / moments.norm(dim=1, keepdim=True).clamp(min=clip))


@torch.no_grad()
def release_statistics(model: nn.Module, images: Tensor, public_size: int, noise_multiplier: float,
                       noise: NoiseSource, clip: float = CLIP, device: str = "cpu",
                       progress: Progress | None = None) -> Statistics:
    """The one release (module docstring, step 2) and its post-processing (step 3): layer name -> (mean, var)."""
    model = model.to(device).eval()
    total: Tensor | None = None
    for start in range(0, len(images), BATCH):
        batch = per_example_moments(model, images[start:start + BATCH].to(device), clip).sum(0)
        total = batch if total is None else total + batch
        if progress:
            progress({"phase": PHASE, "done": min(start + BATCH, len(images)), "total": len(images)})
    noisy = (total + noise.normal(total.shape, noise_multiplier * clip, device)) / public_size
    statistics, at = {}, 0
    for name, layer in normalisation_layers(model).items():
        channels = _channels(layer)
        mean, second = noisy[at:at + channels].cpu(), noisy[at + channels:at + 2 * channels].cpu()
        statistics[name] = (mean, (second - mean.pow(2)).clamp(min=0.0))
        at += 2 * channels
    return statistics


def save_statistics(path: Path, statistics: Statistics, figures: dict[str, Any]) -> None:
    """Written at once (a resumed run never releases them again), with their release's `figures` as metadata."""
    tensors = {f"{name}.{part}": value.contiguous() for name, pair in statistics.items()
               for part, value in zip(("mean", "var"), pair)}
    write_atomically({path: lambda target: save_file(tensors, target, {"release": json.dumps(figures)})})


def load_statistics(path: Path) -> tuple[Statistics, dict[str, Any]]:
    """The statistics in `path` and their release's figures."""
    try:
        with safe_open(path, framework="pt") as file:
            tensors = {key: file.get_tensor(key) for key in file.keys()}
            figures = json.loads((file.metadata() or {})["release"])
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as error:
        raise CheckpointError(f"cannot read the released statistics in {path}: {error}") from error
    names = {key.rsplit(".", 1)[0] for key in tensors}
    if any(f"{name}.{part}" not in tensors for name in names for part in ("mean", "var")):
        raise CheckpointError(f"{path} holds no per-layer mean and variance pairs: not released statistics")
    return {name: (tensors[f"{name}.mean"], tensors[f"{name}.var"]) for name in sorted(names)}, figures


def statistics_targets(model: nn.Module, statistics: Statistics, device: torch.device
                       ) -> dict[nn.Module, tuple[Tensor, Tensor]]:
    """The model's layers paired with their released statistics: refused unless they were released for its layers."""
    layers = normalisation_layers(model)
    shapes = {name: _channels(layer) for name, layer in layers.items()}
    released = {name: len(mean) for name, (mean, _var) in statistics.items()}
    if released != shapes:
        raise ConfigError(f"the released statistics are of layers {released}, the teacher's are {shapes}: they were "
                          f"released for another model")
    return {layers[name]: (mean.to(device), var.to(device)) for name, (mean, var) in statistics.items()}
