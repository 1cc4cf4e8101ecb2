"""Private synthetic data from one noisy release of class-wise mean embeddings (DP-MERF, Harder et al., AISTATS
2021), with fixed perceptual features in the style of DP-MEPF (Harder et al., TMLR 2023).

1. Embed: every private image x becomes phi(x), a vector of norm exactly 1 built from parts fixed before the data
   are read: the normalised scattering coefficients (models/scattering.py), random Fourier features of them and
   random Fourier features of the pixels (each part of norm 1), and a constant coordinate that counts the images.
2. Release: the class-wise sums of phi over the private training set, plus Gaussian noise of std sigma on every
   coordinate. Replacing one example moves at most two rows, by at most 2 in L2 together (one row by
   phi(x') - phi(x), or two rows by phi(x) and phi(x')), so the release is one Gaussian mechanism with noise
   multiplier sigma / 2 under replace-one (sigma / 1 under add/remove), accounted by dp-accounting.
3. Fit (post-processing): each class's synthetic images are optimised so that the mean of their embeddings meets
   the released mean (noisy sum / noisy count). Matching random Fourier features is matching a Gaussian kernel's
   mean embedding (an MMD), so the images spread over the class instead of collapsing on its average.

Departures from DP-MERF: the images are optimised directly (as in private set generation) instead of through a
generator network, and the features are scattering coefficients and their random features beside the pixels'.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_accounting
import torch
from torch import Tensor, nn

from dpdistill.data.base import ImageDataset
from dpdistill.errors import ConfigError
from dpdistill.models.features import frozen_features
from dpdistill.models.scattering import scattering_features
from dpdistill.privacy.accounting import GaussianQuery, calibrate, composed_epsilon, composed_epsilon_rdp
from dpdistill.privacy.randomness import NoiseSource
from dpdistill.progress import Progress, in_phase
from dpdistill.training.state import STATE_SKELETON, Checkpoints, load_state, save_state

EMBEDDING_PARTS = ("scattering", "scattering-rff", "pixel-rff")
SENSITIVITY = 2.0  # L2, replace-one: see the module docstring
SUM_BATCH = 2000  # private images embedded at once
SUMS_PHASE, FIT_PHASE = "class sums", "image fitting"  # the progress display's names: embedding the private
# images (their scattering coefficients first) and summing them, then fitting the synthetic images


@dataclass(frozen=True)
class MeanEmbeddingConfig:
    """Every knob of the mean-embedding synthesiser (`dpdistill synthesize --method dp-merf`)."""

    dataset: str
    epsilon: float
    delta: float = 1e-5
    method: str = "dp-merf"
    embedding: tuple[str, ...] = EMBEDDING_PARTS  # the parts of phi, any of EMBEDDING_PARTS
    rff_features: int = 2000  # random frequencies per random-feature part (a cosine and a sine each)
    scattering_bandwidth: float = 0.5  # Gaussian kernel length scale on the unit-norm scattering coefficients
    pixel_bandwidth: float = 10.0  # Gaussian kernel length scale on the pixels in [-1, 1]
    synthetic_size: int = 1000  # images fitted and written to synthetic.npz (classes balanced)
    steps: int = 300  # optimiser steps on the synthetic images
    batch_per_class: int = 50  # images of each class whose mean embedding a step matches
    lr: float = 0.05  # Adam, on the images' pre-tanh values
    init_mean: float = -1.0  # pre-tanh start of every pixel (-1: a dark background, as in the data sets)
    init_std: float = 0.5
    student_arch: str = "scatter-linear"  # the classifier trained on the synthetic set to evaluate it
    student_epochs: int = 30
    student_lr: float = 1e-3
    student_batch: int = 128
    checkpoint_every: int = 100  # optimiser steps between resumable checkpoints (and one every 30 s at least)
    seed: int = 0  # random features, initial images and batches; never the Gaussian noise
    reproducible_noise: bool = False  # debugging only: the Gaussian noise from the seed, NO guarantee
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.method != "dp-merf":
            raise ConfigError(f"a mean-embedding config is for dp-merf, not {self.method!r}")
        unknown = sorted(set(self.embedding) - set(EMBEDDING_PARTS))
        if unknown or not self.embedding or len(set(self.embedding)) != len(self.embedding):
            raise ConfigError(f"embedding takes distinct parts among {', '.join(EMBEDDING_PARTS)}, got "
                              f"{', '.join(self.embedding) or 'none'}")
        for name in ("rff_features", "synthetic_size", "steps", "batch_per_class", "student_epochs",
                     "student_batch", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("scattering_bandwidth", "pixel_bandwidth", "lr", "student_lr"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.init_std < 0:
            raise ConfigError(f"init_std must be at least 0, got {self.init_std}")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "embedding": list(self.embedding)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "MeanEmbeddingConfig":
        unknown = sorted(set(values) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown dp-merf setting(s): {', '.join(unknown)}")
        if "embedding" in values:
            embedding = values["embedding"]
            parts = embedding.split(",") if isinstance(embedding, str) else embedding
            values = {**values, "embedding": tuple(str(part).strip() for part in parts)}
        return cls(**values)


class Embedding(nn.Module):
    """phi: images -> vectors of norm exactly 1 (module docstring, step 1). Its random frequencies come from
    `seed` and are public: nothing in phi depends on the data."""

    def __init__(self, in_shape: tuple[int, ...], config: MeanEmbeddingConfig) -> None:
        super().__init__()
        self.parts = config.embedding
        self.uses_scattering = any(part.startswith("scattering") for part in self.parts)
        self.divisor = math.sqrt(len(self.parts) + 1)  # the parts and the counting coordinate, each of norm 1
        self.scattering, channels = scattering_features(tuple(in_shape))
        scattering_dim = channels * math.prod(self.scattering[0].out_shape)
        draw = torch.Generator().manual_seed(config.seed)
        self.register_buffer("scattering_frequencies", torch.randn(
            scattering_dim, config.rff_features, generator=draw) / config.scattering_bandwidth)
        self.register_buffer("pixel_frequencies", torch.randn(
            math.prod(in_shape), config.rff_features, generator=draw) / config.pixel_bandwidth)

    @property
    def dim(self) -> int:
        scattering_dim, features = self.scattering_frequencies.shape
        return sum(scattering_dim if part == "scattering" else 2 * features for part in self.parts) + 1

    def forward(self, images: Tensor, coefficients: Tensor | None = None) -> Tensor:
        """phi(images); `coefficients`, the images' scattering coefficients where they are known already."""
        if self.uses_scattering and coefficients is None:
            coefficients = self.scattering(images)
        unit = nn.functional.normalize(coefficients.flatten(1), dim=1) if self.uses_scattering else None
        pieces = [unit if part == "scattering" else
                  _random_features(unit if part == "scattering-rff" else images.flatten(1),
                                   self.scattering_frequencies if part == "scattering-rff" else self.pixel_frequencies)
                  for part in self.parts]
        pieces.append(torch.ones(len(images), 1, device=images.device))
        return torch.cat(pieces, 1) / self.divisor


def _random_features(inputs: Tensor, frequencies: Tensor) -> Tensor:
    """Random Fourier features of a Gaussian kernel, [cos, sin] / sqrt(D): norm exactly 1."""
    angles = inputs @ frequencies
    return torch.cat([angles.cos(), angles.sin()], 1) / math.sqrt(frequencies.shape[1])


@dataclass(frozen=True)
class MeanEmbeddingPlan:
    """The one release, fixed before the data are read: class-wise sums of phi plus N(0, sigma^2)."""

    query: GaussianQuery

    @property
    def sigma(self) -> float:
        return self.query.noise_multiplier * SENSITIVITY

    def release_event(self) -> dp_accounting.DpEvent:
        return self.query.dp_event()

    def summary(self, delta: float) -> dict[str, Any]:
        epsilon = composed_epsilon(self.query, 1, delta)
        return {"mode": "data", "epsilon": epsilon, "delta": delta, "relation": "replace-one",
                "epsilon_replace_one": epsilon,
                "epsilon_add_remove": composed_epsilon(GaussianQuery(self.sigma), 1, delta),
                "epsilon_rdp": composed_epsilon_rdp(self.query, 1, delta),
                "sigma": self.sigma, "noise_multiplier": self.query.noise_multiplier, "sensitivity": SENSITIVITY,
                "accountant": "dp-accounting PLD (one Gaussian mechanism)"}


def plan_mean_embedding(config: MeanEmbeddingConfig) -> MeanEmbeddingPlan:
    """The least noise whose one release stays within (epsilon, delta)."""
    return MeanEmbeddingPlan(calibrate(GaussianQuery, 1, config.epsilon, config.delta))


@dataclass
class MeanEmbeddingResult:
    images: Tensor  # (synthetic_size, C, H, W) in [-1, 1]
    labels: Tensor
    history: list[dict[str, Any]]  # public: distances to the released means
    wall_seconds: float
    release_seconds: float


class MeanEmbeddingSynthesizer:
    """Makes the release once (saved at once, so a resumed run never spends again), then fits the images."""

    def __init__(self, config: MeanEmbeddingConfig, dataset: ImageDataset, plan: MeanEmbeddingPlan,
                 noise: NoiseSource, state_dir: Path, progress: Progress | None = None) -> None:
        if config.synthetic_size < dataset.num_classes:
            raise ConfigError(f"synthetic_size {config.synthetic_size} gives some of the {dataset.num_classes} "
                              f"classes no image: raise --synthetic-size")
        self.config, self.dataset, self.plan, self.noise = config, dataset, plan, noise
        self.state_dir, self.progress = state_dir, progress
        self.device = torch.device(config.device)
        self.embedding = Embedding(dataset.input_shape, config).to(self.device)
        self.labels = torch.arange(config.synthetic_size) % dataset.num_classes
        draw = torch.Generator().manual_seed(config.seed + 1)
        start = config.init_mean + config.init_std * torch.randn(config.synthetic_size, *dataset.input_shape,
                                                                  generator=draw)
        self.raw = start.to(self.device).requires_grad_(True)
        self.optimizer = torch.optim.Adam([self.raw], lr=config.lr)
        self.batches = torch.Generator().manual_seed(config.seed + 2)
        self.members = [torch.nonzero(self.labels == label).squeeze(1) for label in range(dataset.num_classes)]

    def release(self) -> Tensor:
        """The noisy class-wise sums of phi (num_classes, dim): the run's only read of the private data."""
        dataset, device = self.dataset, self.device
        coefficients = (frozen_features(self.embedding.scattering, dataset.x_train, device, fixed=True,
                                        progress=in_phase(self.progress, SUMS_PHASE))
                        if self.embedding.uses_scattering else None)
        sums = torch.zeros(dataset.num_classes, self.embedding.dim, device=device)
        with torch.no_grad():
            for start in range(0, len(dataset.y_train), SUM_BATCH):
                end = start + SUM_BATCH
                phi = self.embedding(dataset.x_train[start:end].to(device),
                                     None if coefficients is None else coefficients[start:end].to(device))
                sums.index_add_(0, dataset.y_train[start:end].to(device), phi)
                if self.progress:
                    self.progress({"phase": SUMS_PHASE, "done": min(end, len(dataset.y_train)),
                                   "total": len(dataset.y_train)})
        return sums + self.noise.normal(sums.shape, self.plan.sigma, device)

    def targets(self, noisy_sums: Tensor) -> Tensor:
        """Released means: noisy sums over the noisy count (the constant coordinate), the count at least 1."""
        counts = (noisy_sums[:, -1] * self.embedding.divisor).clamp(min=1.0)
        return noisy_sums / counts[:, None]

    def run(self, resume: bool) -> MeanEmbeddingResult:
        started = time.perf_counter()
        step, history = 0, []
        if resume and (self.state_dir / STATE_SKELETON).exists():
            state = load_state(self.state_dir)
            noisy_sums, step, history = state["noisy_sums"].to(self.device), state["step"], state["history"]
            with torch.no_grad():
                self.raw.copy_(state["raw"].to(self.device))
            self.optimizer.load_state_dict(state["optimizer"])
            self.batches.set_state(state["batches"])
        else:
            noisy_sums = self.release()
            self._save(noisy_sums, step, history)
        release_seconds = time.perf_counter() - started
        targets = self.targets(noisy_sums)
        config, checkpoints = self.config, Checkpoints(self.config.checkpoint_every)
        while step < config.steps:
            loss = self._step(targets)
            step += 1
            if step % max(1, config.steps // 20) == 0 or step == config.steps:
                history.append({"step": step, "distance": loss})
            # the last step too: a run interrupted while its classifier trains does not fit the images again
            checkpoints(step, lambda: self._save(noisy_sums, step, history), final=step == config.steps)
            if self.progress:
                self.progress({"phase": FIT_PHASE, "step": step, "total": config.steps, "distance": loss})
        images = torch.tanh(self.raw.detach()).cpu()
        return MeanEmbeddingResult(images, self.labels.clone(), history, time.perf_counter() - started,
                                   release_seconds)

    def _step(self, targets: Tensor) -> float:
        """One Adam step on the images of a batch per class: the squared distance of each class's mean embedding
        to its released mean, summed over the classes. Each class is its own forward and backward pass: small
        batches through the scattering transform are twice as fast on a CPU as one large one."""
        take = min(self.config.batch_per_class, min(len(members) for members in self.members))
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for members, target in zip(self.members, targets):
            chosen = members[torch.randperm(len(members), generator=self.batches)[:take]].to(self.device)
            loss = (self.embedding(torch.tanh(self.raw[chosen])).mean(0) - target).pow(2).sum()
            loss.backward()
            total += float(loss.detach())
        self.optimizer.step()
        return total

    def _save(self, noisy_sums: Tensor, step: int, history: list[dict[str, Any]]) -> None:
        save_state(self.state_dir, {"noisy_sums": noisy_sums, "step": step, "history": history,
                                    "raw": self.raw.detach(), "optimizer": self.optimizer.state_dict(),
                                    "batches": self.batches.get_state()})
