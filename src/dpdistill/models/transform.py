"""The input transform of a model trained outside dpdistill, kept inside the model.

dpdistill's images are in [-1, 1]. A model trained elsewhere may expect [0, 1], or standardised inputs
((x - mean) / std per channel); fed [-1, 1] it still answers, only worse, and nothing says why. The transform
declared at import is recorded in the model's description (`input_transform`: `range`, `mean`, `std`) and
applied by the model itself, so that it holds wherever the model is used: transcription, PATE, evaluation and
`dpdistill.load_model`. It has no weights of its own (nothing in the safetensors file).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from dpdistill.errors import ConfigError
from dpdistill.models.base import Classifier

DPDISTILL_RANGE = (-1.0, 1.0)


def input_transform_spec(input_range: Sequence[float] = DPDISTILL_RANGE, mean: Sequence[float] | None = None,
                         std: Sequence[float] | None = None) -> dict[str, Any] | None:
    """The description of a transform (None when there is nothing to do), checked now rather than at first use."""
    values = [float(v) for v in (*input_range, *(mean or ()), *(std or ()))]
    if not all(math.isfinite(v) for v in values):
        raise ConfigError(f"the input transform must be finite numbers, got range {list(input_range)}, mean "
                          f"{mean}, std {std}")
    if len(input_range) != 2 or not input_range[0] < input_range[1]:
        raise ConfigError(f"an input range is LOW,HIGH with LOW < HIGH, got {list(input_range)}")
    if (mean is None) != (std is None) or (mean is not None and (len(mean) != len(std) or not mean)):
        raise ConfigError(f"normalisation needs as many means as standard deviations (one, or one per channel), "
                          f"got mean {mean} and std {std}")
    if std is not None and min(std) <= 0:
        raise ConfigError(f"standard deviations must be positive, got {list(std)}")
    if tuple(float(v) for v in input_range) == DPDISTILL_RANGE and mean is None:
        return None
    return {"range": [float(v) for v in input_range],
            "mean": None if mean is None else [float(v) for v in mean],
            "std": None if std is None else [float(v) for v in std]}


def parse_input_transform(input_range: str | None, normalize: str | None) -> dict[str, Any] | None:
    """The transform given on the command line: `--input-range LOW,HIGH` and `--normalize MEAN,STD` (one pair, or
    every channel's mean, then every channel's std)."""
    bounds = DPDISTILL_RANGE if input_range is None else _numbers(input_range, "--input-range")
    if normalize is None:
        return input_transform_spec(bounds)
    statistics = _numbers(normalize, "--normalize")
    if len(statistics) % 2:
        raise ConfigError(f"--normalize takes MEAN,STD (or all the channels' means, then all their stds): an even "
                          f"number of values, got {normalize!r}")
    half = len(statistics) // 2
    return input_transform_spec(bounds, statistics[:half], statistics[half:])


def _numbers(text: str, option: str) -> list[float]:
    try:
        return [float(value) for value in text.split(",")]
    except ValueError:
        raise ConfigError(f"{option} takes comma-separated numbers, got {text!r}") from None


class InputTransform(nn.Module):
    """[-1, 1] -> `range` linearly, then (x - mean) / std per channel: what the model saw when it was trained."""

    def __init__(self, spec: dict[str, Any], channels: int) -> None:
        super().__init__()
        low, high = spec["range"]
        self.low, self.scale = float(low), (float(high) - float(low)) / 2
        mean, std = spec.get("mean"), spec.get("std")
        if mean is not None and len(mean) not in (1, channels):
            raise ConfigError(f"normalisation gives {len(mean)} values per statistic for images with {channels} "
                              f"channel(s): give one, or one per channel")
        # buffers follow the model to its device; not persistent: the description holds them, not the weights
        self.register_buffer("mean", None if mean is None else torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", None if std is None else torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        x = self.low + (x + 1) * self.scale
        return x if self.mean is None else (x - self.mean) / self.std


class TransformedClassifier(Classifier):
    """A classifier that takes dpdistill's [-1, 1] images and transforms them as its own training did."""

    def __init__(self, model: Classifier, transform: InputTransform) -> None:
        super().__init__()
        self.model = model
        self.transform = transform

    def features(self, x: Tensor) -> Tensor:
        return self.model.features(self.transform(x))

    def classify(self, features: Tensor) -> Tensor:
        return self.model.classify(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(self.transform(x))
