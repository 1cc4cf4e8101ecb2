"""A DP picture of the data for a generator: one Gaussian release of the per-channel mean and second moment of the
inputs of a released model's normalisation layers over the private training set, and (with a `resolution`) of
each class's images at that coarse resolution. BatchNorm keeps the first as running statistics, and matching them
is what lets the data-free engine draw images like the data (DeepInversion, DP-DFD); a DP-SGD model normalises
each example on its own (GroupNorm) and keeps none, so they are released here. They fix an image's polarity and
texture but not its form, which the per-class pixel statistics (what each class looks like, blurred) pin.

1. Per example, two parts, each of L2 norm at most `clip`:
   - for each GroupNorm or BatchNorm layer of the model, the spatial mean of each channel of its input and of that
     input squared, concatenated over the layers and clipped to `clip` (CLIP by default, chosen on the MNIST set:
     above the 99th percentile of the norms its DP teacher gives, so clipping leaves nearly every example as it is;
     benchmarks/experiments/released_statistics.py; a teacher trained longer has larger moments and needs a larger
     `clip`, or its statistics shrink: benchmarks/experiments/teacher_layer_moments.py). Or `clip` is chosen from
     the data at `NORM_SHARE` of the release: a noisy histogram of the norms (counts over a fixed geometric grid)
     gives their median's cell, and `clip` is `CLIP_OVER_MEDIAN` times its upper edge;
   - with a `resolution` R, in the slot of the example's class (zeros in the others): the image, mapped to [0, 1]
     and averaged over R x R cells, with its square (clipped to `image_clip`), and a count entry `image_clip`, all
     scaled by `clip / (sqrt(2) image_clip)`.
2. Release: their sum over the private training set plus Gaussian noise of std `noise_multiplier` times the
   sensitivity on every coordinate. One example added or removed moves the sum by at most `clip` in L2, or
   `sqrt(2) clip` with the class part (replaced: twice that), so it is one Gaussian mechanism of that multiplier
   (half of it under replace-one), accounted by dp-accounting. A chosen `clip` adds the histogram, whose counts one
   example moves by 1 in L2 (replaced: sqrt(2)): two Gaussian mechanisms of multipliers m / sqrt(s) and
   m / sqrt(1 - s) compose, adaptively and exactly, into one of multiplier m (Gaussian DP: mu^2 = s / m^2 +
   (1 - s) / m^2), so the release's epsilon is unchanged and only the moments' noise grows, by 1 / sqrt(1 - s).
3. Post-processing: the layers' noisy sums over the public training-set size give each channel's mean and second
   moment, the class part's over its noisy count each class's cell means and second moments; each variance is the
   difference, at least 0.

The model read here is itself a DP release (the teacher), public once released, so it is fixed before this release
reads the data, and the two compose adaptively: a release states the composition of both as its epsilon
(methods/release.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from dpdistill.atomic import write_atomically
from dpdistill.errors import CheckpointError, ConfigError
from dpdistill.losses.generator import ClassCellStatistics, image_cells
from dpdistill.privacy.accounting import (ADD_REMOVE, REPLACE_ONE, GaussianQuery, calibrate, composed_epsilon,
                                          epsilon_key)
from dpdistill.privacy.ledger import Release
from dpdistill.privacy.randomness import NoiseSource
from dpdistill.progress import Progress

STATISTICS_FILE = "statistics.safetensors"  # beside the model they were released for
STATISTICS_METHOD = "release: feature statistics"  # their entry in that model's ledger
CLIP = 20.0  # per-example L2 bound of the moments (module docstring, step 1)
RESOLUTION = 14  # the class part's default cells (R x R): a garment's form, at a noise its 6,000 images average
IMAGE_CLIP_PER_SIDE = 0.6  # the class part's bound over R: the MNIST set's 99th percentile of its norm is 3.8 at
# R = 7 and 8.6 at R = 14 (benchmarks/experiments/released_statistics.py --norms)
NORM_SHARE = 0.05  # of the release (of its 1 / multiplier^2) spent on the norms' median when `clip` is chosen
CLIP_OVER_MEDIAN = 1.25  # `clip` over the median's cell edge: the 99th percentile of the norms is at most 1.09
# times their median for the MNIST set's DP teachers (3 to 10 epochs; Fashion-MNIST's diagnostic: 1.16 to 1.22)
NORM_EDGES = 2.0 ** (torch.arange(-16, 97) / 8)  # the histogram's cells: 1/4 to 4096, eight to an octave
BATCH = 1000  # private images through the model at once
PHASE = "released statistics"  # the progress display's name
CLASSES_KEY = "classes@image"  # the file's key of the class part (no module can be named so: it holds a "@")
LayerStatistics = dict[str, tuple[Tensor, Tensor]]  # layer name -> (per-channel mean, per-channel variance)


@dataclass(frozen=True)
class Statistics:
    """A release's post-processed statistics: per layer, and (where released) per class, (classes, C x R x R) cell
    means and variances of its images in [0, 1]."""

    layers: LayerStatistics
    classes: tuple[Tensor, Tensor] | None = None


@dataclass(frozen=True)
class StatisticsPlan:
    """The one release, fixed before the data are read: noise of std `multiplier` times the sensitivity on the
    moments' sum, which one example added or removed moves by at most `clip`, or `sqrt(2) clip` with the class part
    of `resolution` (replaced: twice that)."""

    multiplier: float  # noise std over the add-remove sensitivity
    delta: float
    clip: float | None = CLIP  # None: chosen from the data at `norm_share` (`with_clip`)
    resolution: int = 0  # the class part's R x R cells (0: no class part)
    image_clip: float | None = None  # its bound [default: IMAGE_CLIP_PER_SIDE x resolution]
    norm_share: float = 0.0  # of 1 / multiplier^2 spent on the norms' histogram (module docstring, step 2)
    norm_median: float | None = None  # the upper edge of the cell of the norms' noisy median, once drawn

    def __post_init__(self) -> None:
        if self.image_clip is None:
            object.__setattr__(self, "image_clip", IMAGE_CLIP_PER_SIDE * self.resolution)

    @classmethod
    def of_figures(cls, figures: dict[str, Any]) -> "StatisticsPlan":
        """The plan a statistics file's `figures` describe (files without a class part: resolution 0; with a bound
        given: no norm share)."""
        return cls(float(figures["noise_multiplier"]), float(figures["delta"]), float(figures["clip"]),
                   int(figures.get("resolution", 0)), figures.get("image_clip"), float(figures.get("norm_share", 0)),
                   figures.get("norm_median"))

    @property
    def moments_multiplier(self) -> float:
        """The moments' noise std over their sensitivity: all of `multiplier` unless the norms took a share."""
        return self.multiplier / math.sqrt(1 - self.norm_share)

    @property
    def norm_multiplier(self) -> float:
        """The norms' histogram's noise std (in counts: one example moves one count)."""
        return self.multiplier / math.sqrt(self.norm_share)

    def with_clip(self, norm_median: float) -> "StatisticsPlan":
        """The plan once the norms' noisy median is drawn: `clip` CLIP_OVER_MEDIAN times it."""
        return dataclasses.replace(self, clip=CLIP_OVER_MEDIAN * norm_median, norm_median=norm_median)

    @property
    def sensitivity(self) -> float:
        """How far one example added or removed moves the sum in L2: each part at most `clip`."""
        return self.clip * (math.sqrt(2) if self.resolution else 1.0)

    @property
    def class_scale(self) -> float:
        """The class part's factor: its cell moments (norm at most `image_clip`) and count entry (`image_clip`)
        then have norm at most `clip` together."""
        return self.clip / (math.sqrt(2) * self.image_clip)

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
                "resolution": self.resolution, "image_clip": self.image_clip,
                **({"norm_share": self.norm_share, "norm_median": self.norm_median,
                    "accountant": "dp-accounting (the norms' histogram and the moments: two Gaussian mechanisms, "
                                  "composed exactly into one of noise_multiplier)"} if self.norm_share else
                   {"accountant": "dp-accounting (one Gaussian mechanism)"})}


def plan_statistics(epsilon: float, delta: float, relation: str, resolution: int = 0, clip: float | None = CLIP
                    ) -> StatisticsPlan:
    """The least noise whose release stays within (epsilon, delta) under `relation`, the layers' moments bounded
    at `clip` (the noise grows with it, the epsilon does not), or (None) at one chosen from the norms' noisy median
    at NORM_SHARE of it."""
    query = calibrate(GaussianQuery, 1, epsilon, delta)
    return StatisticsPlan(query.noise_multiplier * _sensitivity(relation), delta, clip, resolution,
                          norm_share=NORM_SHARE if clip is None else 0.0)


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
    return clipped_rows(layer_moments(model, images), clip)


def layer_moments(model: nn.Module, images: Tensor) -> Tensor:
    """(n, D): `per_example_moments` before the clip."""
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
    return torch.cat([torch.cat([captured[name].mean((2, 3)), captured[name].pow(2).mean((2, 3))], 1)
                      for name in layers], 1)


def clipped_rows(rows: Tensor, clip: float) -> Tensor:
    """Each row scaled down to L2 norm `clip` where it is longer."""
    return rows * (clip / rows.norm(dim=1, keepdim=True).clamp(min=clip))


def class_part(images: Tensor, labels: Tensor, plan: StatisticsPlan, num_classes: int) -> Tensor:
    """(n, classes x (2 C R R + 1)): each example's cell moments clipped to `image_clip` with the count entry
    `image_clip`, in its class's slot, scaled by `class_scale` (module docstring, step 1)."""
    cells = image_cells(images, plan.resolution)
    moments = clipped_rows(torch.cat([cells, cells.pow(2)], 1), plan.image_clip)
    slot = torch.cat([moments, moments.new_full((len(moments), 1), plan.image_clip)], 1) * plan.class_scale
    part = slot.new_zeros(len(slot), num_classes, slot.shape[1])
    part[torch.arange(len(slot)), labels] = slot
    return part.flatten(1)


@torch.no_grad()
def noisy_norm_median(model: nn.Module, images: Tensor, plan: StatisticsPlan, noise: NoiseSource, device: str = "cpu",
                      progress: Progress | None = None) -> float:
    """The upper edge of the NORM_EDGES cell where the noisy histogram of the moments' norms first holds half its
    noisy total (module docstring, step 1): the release's first draw, at its `norm_share`."""
    model = model.to(device).eval()
    counts = torch.zeros(len(NORM_EDGES) + 1, dtype=torch.float64)
    for start in range(0, len(images), BATCH):
        norms = layer_moments(model, images[start:start + BATCH].to(device)).norm(dim=1).cpu()
        counts += torch.bincount(torch.bucketize(norms, NORM_EDGES), minlength=len(counts)).double()
        if progress:
            progress({"phase": PHASE, "done": min(start + BATCH, len(images)), "total": len(images)})
    noisy = counts + noise.normal(counts.shape, plan.norm_multiplier, "cpu").double()
    below = noisy.cumsum(0)
    cell = min(int((below < below[-1] / 2).sum()), len(NORM_EDGES) - 1)  # the last cell is open: its lower edge
    return float(NORM_EDGES[cell])


@torch.no_grad()
def release_statistics(model: nn.Module, images: Tensor, labels: Tensor, public_size: int, plan: StatisticsPlan,
                       num_classes: int, noise: NoiseSource, device: str = "cpu",
                       progress: Progress | None = None) -> Statistics:
    """The one release (module docstring, step 2) and its post-processing (step 3)."""
    model = model.to(device).eval()
    total: Tensor | None = None
    for start in range(0, len(images), BATCH):
        batch = images[start:start + BATCH].to(device)
        parts = [per_example_moments(model, batch, plan.clip)]
        if plan.resolution:
            parts.append(class_part(batch, labels[start:start + BATCH].to(device), plan, num_classes))
        summed = torch.cat(parts, 1).sum(0)
        total = summed if total is None else total + summed
        if progress:
            progress({"phase": PHASE, "done": min(start + BATCH, len(images)), "total": len(images)})
    noisy = (total + noise.normal(total.shape, plan.moments_multiplier * plan.sensitivity, device)).cpu()
    layers = layer_statistics(model, noisy / public_size)
    if not plan.resolution:
        return Statistics(layers)
    slots = noisy[2 * sum(len(mean) for mean, _var in layers.values()):].view(num_classes, -1) / plan.class_scale
    counts = (slots[:, -1:] / plan.image_clip).clamp(min=1.0)
    means, variances = zip(*(_mean_and_variance(row) for row in slots[:, :-1] / counts))
    return Statistics(layers, (torch.stack(means), torch.stack(variances)))


def layer_statistics(model: nn.Module, mean_moments: Tensor) -> LayerStatistics:
    """Each normalisation layer's channel means and variances from the mean of the per-example moments (in
    `per_example_moments`' order; anything after the layers' part is left)."""
    layers, at = {}, 0
    for name, layer in normalisation_layers(model).items():
        channels = _channels(layer)
        layers[name] = _mean_and_variance(mean_moments[at:at + 2 * channels])
        at += 2 * channels
    return layers


def _mean_and_variance(moments: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, variance at least 0) from a vector of means followed by second moments."""
    mean, second = moments.chunk(2)
    return mean, (second - mean.pow(2)).clamp(min=0.0)


def save_statistics(path: Path, statistics: Statistics, figures: dict[str, Any]) -> None:
    """Written at once (a resumed run never releases them again), with their release's `figures` as metadata."""
    pairs = {**statistics.layers, **({} if statistics.classes is None else {CLASSES_KEY: statistics.classes})}
    tensors = {f"{name}.{part}": value.contiguous() for name, pair in pairs.items()
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
    pairs = {name: (tensors[f"{name}.mean"], tensors[f"{name}.var"]) for name in sorted(names)}
    return Statistics(pairs, pairs.pop(CLASSES_KEY, None)), figures


def statistics_targets(model: nn.Module, statistics: Statistics, device: torch.device
                       ) -> dict[nn.Module, tuple[Tensor, Tensor]]:
    """The model's layers paired with their released statistics: refused unless they were released for its layers."""
    layers = normalisation_layers(model)
    shapes = {name: _channels(layer) for name, layer in layers.items()}
    released = {name: len(mean) for name, (mean, _var) in statistics.layers.items()}
    if released != shapes:
        raise ConfigError(f"the released statistics are of layers {released}, the teacher's are {shapes}: they were "
                          f"released for another model")
    return {layers[name]: (mean.to(device), var.to(device)) for name, (mean, var) in statistics.layers.items()}


def class_targets(statistics: Statistics, in_shape: tuple[int, int, int], num_classes: int, device: torch.device
                  ) -> ClassCellStatistics | None:
    """The generator's term against the class part, where released; refused unless it was released for images of
    `in_shape` in `num_classes` classes."""
    if statistics.classes is None:
        return None
    mean, var = statistics.classes
    resolution = math.isqrt(mean.shape[1] // in_shape[0]) if mean.dim() == 2 else 0
    if mean.shape[0] != num_classes or resolution == 0 or in_shape[0] * resolution ** 2 != mean.shape[1]:
        raise ConfigError(f"the released class statistics have shape {tuple(mean.shape)}: not for {num_classes} "
                          f"classes of {in_shape[0]}-channel images")
    return ClassCellStatistics(mean.to(device), var.to(device), resolution)
